"""See on a laptop the precision drift a 910B shows: train twice, exact and chip.

The model, data and learning-rate schedule are the demo's
(examples/llama_cuda/train.py, the LLaMA-style decoder `make demo` trains).
It is trained twice on one emulated npu from the same seed and the same
batches: once in the default exact mode (npu = CPU, bit for bit), once in
chip mode (torch_npu.emulator.set_numerics("chip")), where fp32 matmul and
convolution inputs are rounded as the chip's cube unit rounds them
(docs/numerics.md). One PNG shows both loss curves and the per-step
difference.

The run is fp32 (no autocast): under bf16/fp16 autocast the matmuls already
take 16-bit inputs and chip mode has nothing to round. The demo model has no
convolution, and matmul HF32 is off by default on the chip
(torch.npu.matmul.allow_hf32 = False), so by default this example switches
it on, as a port of CUDA code that enabled TF32 would; `--matmul-hf32 off`
keeps the chip default (the two curves are then identical), and
`--precision-mode allow_fp32_to_fp16` sets ACL_PRECISION_MODE instead.

    python examples/numerics_drift.py --out-dir /tmp/drift          # tiny model, 40 steps (the demo's tiny run)
    python examples/numerics_drift.py --size small --steps 160 --out-dir /tmp/drift   # `make demo`'s size
"""
import argparse
import importlib.util
import json
import os
import sys

import torch
import torch.nn.functional as F

import torch_npu
from torch_npu import emulator

HERE = os.path.dirname(os.path.abspath(__file__))


def load_demo_train():
    """examples/llama_cuda/train.py as a module (the demo's model, data and schedule)."""
    spec = importlib.util.spec_from_file_location("llama_cuda_train", os.path.join(HERE, "llama_cuda", "train.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def train(demo, size, steps, mode):
    """Losses (floats, one per step) of one fp32 training run in numerics `mode`."""
    emulator.set_numerics(mode)
    try:
        dim, layers, heads, context, batch, _ = demo.SIZES[size]
        data, vocab = demo.load_corpus()
        torch.manual_seed(0)
        model = demo.Llama(vocab, dim, layers, heads, context).to("npu")
        opt = torch.optim.AdamW(model.parameters(), lr=demo.lr_at(0, steps), betas=(0.9, 0.95), weight_decay=0.1)
        losses = []
        for step in range(steps):
            for group in opt.param_groups:
                group["lr"] = demo.lr_at(step, steps)
            x, y = demo.batch_for(data, step, 0, batch, context)
            x, y = x.to("npu"), y.to("npu")
            loss = F.cross_entropy(model(x).view(-1, vocab), y.view(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(loss.item())
        return losses
    finally:
        emulator.set_numerics("exact")


def plot(exact, chip, path, title):
    """One PNG: both loss curves (top) and chip - exact per step (bottom)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker
    steps = list(range(1, len(exact) + 1))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6.5), sharex=True,
                                      gridspec_kw={"height_ratios": [2, 1]})
    top.plot(steps, exact, label="exact (npu = CPU)", color="tab:blue", linewidth=1.6)
    top.plot(steps, chip, label="chip (910B rounding)", color="tab:orange", linewidth=1.2, linestyle="--")
    top.set_ylabel("training loss")
    top.set_title(title)
    top.legend()
    top.grid(alpha=0.3)
    diff = [c - e for c, e in zip(chip, exact)]
    bottom.plot(steps, diff, color="tab:red", linewidth=1.2)
    bottom.axhline(0.0, color="black", linewidth=0.6)
    bottom.set_xlabel("step")
    bottom.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    bottom.set_ylabel("chip − exact")
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=["small", "tiny"], default="tiny")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--matmul-hf32", choices=["on", "off"], default="on",
                        help="torch.npu.matmul.allow_hf32 for both runs (the chip's default is off)")
    parser.add_argument("--precision-mode", choices=["must_keep_origin_dtype", "allow_fp32_to_fp16"], default=None,
                        help="ACL_PRECISION_MODE for both runs (unset: the 910B default, must_keep_origin_dtype)")
    parser.add_argument("--out-dir", required=True)
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be at least 1, got {args.steps}")

    torch.npu.matmul.allow_hf32 = args.matmul_hf32 == "on"
    if args.precision_mode:
        torch.npu.set_option({"ACL_PRECISION_MODE": args.precision_mode})
    demo = load_demo_train()
    exact = train(demo, args.size, args.steps, "exact")
    emulator.reset_numerics_report()
    chip = train(demo, args.size, args.steps, "chip")
    report = emulator.numerics_report()

    os.makedirs(args.out_dir, exist_ok=True)
    png = os.path.join(args.out_dir, "numerics_drift.png")
    switches = f"matmul.allow_hf32={args.matmul_hf32}, conv.allow_hf32={'on' if torch.npu.conv.allow_hf32 else 'off'}"
    if args.precision_mode:
        switches += f", ACL_PRECISION_MODE={args.precision_mode}"
    plot(exact, chip, png, f"demo LLaMA ({args.size}), fp32: exact vs chip numerics\n{switches}")
    diffs = [abs(c - e) for c, e in zip(chip, exact)]
    with open(os.path.join(args.out_dir, "numerics_drift.json"), "w") as f:
        json.dump({"exact": exact, "chip": chip, "switches": switches, "numerics_report": report}, f, indent=1)

    print(f"{args.steps} steps, {switches}")
    print(f"final loss: exact {exact[-1]:.6f}, chip {chip[-1]:.6f}; largest |chip - exact| {max(diffs):.3e} "
          f"(step {diffs.index(max(diffs)) + 1}); steps that differ: {sum(d != 0 for d in diffs)}/{len(diffs)}")
    print("ops that ran with reduced precision (chip run):")
    for e in report:
        share = e["changed"] / e["elements"] if e["elements"] else 0.0
        print(f"  {e['op']:<36} {e['calls']:>6} calls  {e['rounding']:<9} {e['elements']:>12} elements rounded, "
              f"{share:6.1%} changed")
    if not report:
        print("  none (the switches keep fp32)")
    print(f"wrote {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
