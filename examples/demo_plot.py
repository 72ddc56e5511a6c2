"""The demo's loss-curve PNG, drawn with matplotlib (Agg backend, no display needed).

matplotlib is installed by `make demo`; in an environment without it the demo
skips only the picture (:func:`loss_curve_png` returns the reason).
"""

MISSING_MATPLOTLIB = "matplotlib is not installed (pip install matplotlib): the loss-curve picture is skipped"


def _pyplot():
    """matplotlib.pyplot on the Agg backend, or None when matplotlib cannot be imported."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def loss_curve_png(path, full, resumed, checkpoint_step):
    """Write the loss curves to the PNG file ``path``; return None, or the reason it was skipped.

    ``full`` and ``resumed`` map step -> loss: the uninterrupted run (a line) and the run
    resumed from the checkpoint at ``checkpoint_step`` (markers); a red diamond on a dashed vertical
    line marks the checkpoint."""
    plt = _pyplot()
    if plt is None:
        return MISSING_MATPLOTLIB
    steps = sorted(full)
    fig, ax = plt.subplots(figsize=(8, 5), dpi=100)
    try:
        ax.plot(steps, [full[s] for s in steps], color="tab:blue", linewidth=2, label="uninterrupted run")
        resumed_steps = sorted(resumed)
        # Hollow, thinned markers: the line stays visible under them where the two runs agree.
        ax.plot(resumed_steps, [resumed[s] for s in resumed_steps], linestyle="none", marker="o", markersize=6,
                markerfacecolor="none", markeredgewidth=1.5, color="tab:orange",
                markevery=max(1, len(resumed_steps) // 40), label=f"resumed from the step-{checkpoint_step} checkpoint")
        ax.axvline(checkpoint_step, color="tab:red", linestyle="--", linewidth=1.2)
        ax.plot([checkpoint_step], [full.get(checkpoint_step, resumed.get(checkpoint_step, float("nan")))],
                marker="D", markersize=9, color="tab:red", linestyle="none",
                label=f"checkpoint at step {checkpoint_step}, then kill -9")
        ax.set_xlabel("step")
        ax.set_ylabel("loss (mean over ranks)")
        ax.set_title("Training on 2 virtual NPUs: the resumed run follows the uninterrupted one")
        ax.grid(True, alpha=0.3)
        ax.legend(loc="upper right")
        fig.tight_layout()
        fig.savefig(path, format="png")
    finally:
        plt.close(fig)
    return None
