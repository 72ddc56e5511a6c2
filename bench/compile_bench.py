"""Graph-mode benchmark: the GPT block train step under torch.compile.

Reports compiled-npu / compiled-CPU step time (target <= 1.05: the npu path
runs the same Inductor CPU kernels on zero-copy aliases) and compiled-npu vs
eager-npu speedup. Interleaved medians (bench/_timing.py).

    .venv/bin/python bench/compile_bench.py [--quick]
"""
from __future__ import annotations

import argparse
import copy
import os
import sys
import traceback

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_npu  # noqa: E402,F401
import _timing as T  # noqa: E402
import workloads as W  # noqa: E402

TARGET_RATIO = 1.05


class _WrittenOutAttention(W.CausalSelfAttention):
    """The workload's attention without F.scaled_dot_product_attention (which
    needs a C++ fix before it traces on fake npu tensors; docs/graph_mode.md)."""

    def forward(self, x):
        B, T_, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T_, self.n_heads, C // self.n_heads).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / (C // self.n_heads) ** 0.5
        mask = torch.ones(T_, T_, dtype=torch.bool, device=x.device).tril()
        y = att.masked_fill(~mask, float("-inf")).softmax(-1) @ v
        return self.proj(y.transpose(1, 2).contiguous().view(B, T_, C))


def _step_fn(model, x, y):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss
    return step


def run(quick: bool = False, batch: int = 4, seq: int = 128, d_model: int = 256, n_heads: int = 4,
        written_out_attention: bool = False) -> dict:
    g = torch.Generator().manual_seed(2)
    x = torch.randn(batch, seq, d_model, generator=g)
    y = torch.randn(batch, seq, d_model, generator=g)
    torch.manual_seed(0)
    base = W.GPTBlock(d_model, n_heads)
    if written_out_attention:
        attn = _WrittenOutAttention(d_model, n_heads)
        attn.load_state_dict(base.attn.state_dict())
        base.attn = attn
    cpu_c = torch.compile(copy.deepcopy(base))
    npu_model = copy.deepcopy(base).to("npu")
    npu_e = copy.deepcopy(npu_model)
    npu_c = torch.compile(npu_model)
    xn, yn = x.to("npu"), y.to("npu")
    steps = {"cpu_compiled": _step_fn(cpu_c, x, y), "npu_compiled": _step_fn(npu_c, xn, yn),
             "npu_eager": _step_fn(npu_e, xn, yn)}
    losses = {k: float(fn()) for k, fn in steps.items()}   # compiles, and warms up
    variants = [T.Variant("cpu_compiled", steps["cpu_compiled"]),
                T.Variant("npu_compiled", steps["npu_compiled"], sync=W.npu_sync),
                T.Variant("npu_eager", steps["npu_eager"], sync=W.npu_sync)]
    s = T.time_interleaved(variants, reps=5 if quick else 15, inner=1, warmup=2,
                           max_seconds=30 if quick else 120, min_reps=3)
    cpu_ms, npu_ms, eager_ms = (s.median_us(k) / 1e3 for k in ("cpu_compiled", "npu_compiled", "npu_eager"))
    label = ", attention written out" if written_out_attention else ""
    return {"name": f"GPT block d{d_model} h{n_heads} T{seq} bs{batch}, AdamW (compiled{label})",
            "cpu_compiled_ms": cpu_ms, "npu_compiled_ms": npu_ms, "npu_eager_ms": eager_ms,
            "ratio": npu_ms / cpu_ms, "speedup_vs_eager": eager_ms / npu_ms,
            "status": "PASS" if npu_ms / cpu_ms <= TARGET_RATIO else "FAIL",
            "first_step_losses": losses, "reps": s.reps,
            "zero_copy": __import__("torch_npu._inductor.cpu_alias", fromlist=["x"]).is_zero_copy()}


def print_table(rec: dict) -> None:
    print("| workload | compiled CPU ms | compiled npu ms | **ratio** | target | status | eager npu ms | "
          "compiled vs eager npu | zero-copy outputs |")
    print("|---|---:|---:|---:|---:|:---:|---:|---:|:---:|")
    if "error" in rec:
        print(f"| {rec.get('name', 'GPT block (compiled)')} | - | - | ERROR: `{rec['error'][:300]}` | "
              f"≤ {TARGET_RATIO} | ERROR | | | |")
        return
    print(f"| {rec['name']} | {rec['cpu_compiled_ms']:.2f} | {rec['npu_compiled_ms']:.2f} | "
          f"**{rec['ratio']:.3f}** | ≤ {TARGET_RATIO} | {rec['status']} | {rec['npu_eager_ms']:.2f} | "
          f"×{rec['speedup_vs_eager']:.2f} | {rec['zero_copy']} |")


def run_section(quick: bool = False) -> list:
    print("\n## Graph mode: torch.compile (GPT block train step)\n", flush=True)
    records = []
    for written_out in (False, True):
        try:
            rec = run(quick=quick, written_out_attention=written_out)
        except Exception as e:  # report, don't die
            rec = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
        print_table(rec)
        records.append(rec)
    return records


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    a = p.parse_args()
    torch.set_num_threads(2)
    run_section(a.quick)
