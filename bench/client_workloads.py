#!/usr/bin/env python
"""Client-workload benchmark: tiny transformers / diffusers / peft models on npu vs CPU.

    .venv/bin/python bench/client_workloads.py            # full run (5 to 17 min on 2 cores, longer when noisy)
    .venv/bin/python bench/client_workloads.py --quick    # a few minutes
    .venv/bin/python bench/client_workloads.py --only llama,unet --json out.json

What client code (transformers' own model tests, a fine-tuning script) does with a
small model, timed on native CPU tensors and on npu tensors in the same process,
interleaved (cpu npu, npu cpu, ...), medians over reps:

* ``construct``: the model built from its config (random init) plus ``.to(device)``;
* ``train``: one zero_grad / forward / loss / backward / AdamW step, with each
  ``attn_implementation`` transformers offers on npu: ``sdpa`` (its default),
  ``eager`` and ``flash_attention_2`` (on npu that is ``torch_npu.npu_fusion_attention``,
  transformers' integrations/npu_flash_attention.py). CPU has no flash path, so the
  flash row compares against CPU's ``sdpa``, the best CPU composite of the same math.
  Flash rows exist for llama, bert and mixtral: transformers refuses flash for t5, and
  its flash path fails on float32 gpt2 (``get_target_dtype`` looks for an nn.Linear;
  GPT-2 uses Conv1D) on any device;
* ``generate``: 32 greedy new tokens (decoder and encoder-decoder models). transformers
  decodes MoE experts with ``batched_mm`` on any device but the CPU, which keeps
  ``grouped_mm``: a second mixtral row runs both devices on ``batched_mm``;
* a diffusers ``UNet2DConditionModel`` train step and a peft LoRA train step.

The models are built locally from tiny configs (no hub download). Each row's ratio is
median(npu) / median(CPU); the geometric mean is over all rows that ran. Targets: every
row ≤ 1.15, geometric mean ≤ 1.05. Exits 0 on a target miss (a report, not a test).
Each row also shows the 95% bootstrap interval of its ratio (reps resampled in
their interleaved pairs). A full run times 40 reps per row, then keeps sampling a
noisy row (up to 200 reps, 45 s) until that interval is within ±3% of the ratio:
on a shared machine, 40 reps of a 30%-IQR row leave the ratio uncertain by ±10%.
One intra-op thread by default: the models are tiny, and on a shared machine a second
OpenMP thread only adds barrier waits (noise) to both sides.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import sys
import time
import traceback
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402
import torch_npu  # noqa: E402,F401

import _timing as T  # noqa: E402

ROW_TARGET = 1.15
GEOMEAN_TARGET = 1.05
GEN_TOKENS = 32

# reps / seconds per rep (sets N calls per rep) / wall cap per row / warm-up reps
# max_reps / ci: past `reps`, a row keeps sampling (up to max_reps, within cap_s)
# until the 95% bootstrap interval of its ratio is within ±ci of the ratio.
PROFILES = {
    "full": dict(reps=40, rep_s=0.1, cap_s=45.0, warmup=2, max_reps=200, ci=0.03),
    "quick": dict(reps=10, rep_s=0.05, cap_s=5.0, warmup=1, max_reps=10, ci=1.0),
}

MODELS = ("llama", "bert", "gpt2", "t5", "mixtral")
EXTRAS = ("unet", "lora")
ATTN_IMPLS = ("sdpa", "eager", "flash_attention_2")
FLASH_MODELS = ("llama", "bert", "mixtral")
SEQ, BATCH, VOCAB = 32, 2, 512


def npu_sync():
    torch.npu.synchronize()


# --------------------------------------------------------------------------
# model zoo (tiny configs, built locally)
# --------------------------------------------------------------------------

def _config(kind):
    import transformers as tf
    common = dict(vocab_size=VOCAB, pad_token_id=0)
    if kind == "llama":
        return tf.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                              num_key_value_heads=2, max_position_embeddings=128, **common), tf.LlamaForCausalLM
    if kind == "bert":
        return tf.BertConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                             max_position_embeddings=128, **common), tf.BertForMaskedLM
    if kind == "gpt2":
        return tf.GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=128, vocab_size=VOCAB,
                             bos_token_id=1, eos_token_id=2, pad_token_id=0), tf.GPT2LMHeadModel
    if kind == "t5":
        return tf.T5Config(d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4,
                           decoder_start_token_id=0, **common), tf.T5ForConditionalGeneration
    if kind == "mixtral":
        return tf.MixtralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                                max_position_embeddings=128, **common), tf.MixtralForCausalLM
    raise ValueError(kind)


def build(kind, attn, device):
    """A freshly initialised (seeded) model of ``kind`` with ``attn`` attention, on ``device``."""
    cfg, cls = _config(kind)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = cls._from_config(cfg, attn_implementation=attn)
    return model.to(device)


def batch(kind, device):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, VOCAB, (BATCH, SEQ), generator=g)
    out = {"input_ids": ids, "labels": ids.clone()}
    if kind == "t5":
        out["labels"] = torch.randint(3, VOCAB, (BATCH, SEQ // 2), generator=g)
    return {k: v.to(device) for k, v in out.items()}


def train_step_fn(model, inputs, params=None):
    opt = torch.optim.AdamW(params if params is not None else model.parameters(), lr=1e-4)
    model.train()

    def step():
        opt.zero_grad(set_to_none=True)
        loss = model(**inputs).loss
        loss.backward()
        opt.step()
        return loss
    return step


def _unet(device):
    from diffusers import UNet2DConditionModel
    torch.manual_seed(0)
    model = UNet2DConditionModel(
        sample_size=8, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(16, 32),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=16, attention_head_dim=4, norm_num_groups=8).to(device)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(BATCH, 4, 8, 8, generator=g).to(device)
    t = torch.tensor([10, 500]).to(device)
    enc = torch.randn(BATCH, 8, 16, generator=g).to(device)
    target = torch.randn(BATCH, 4, 8, 8, generator=g).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x, t, encoder_hidden_states=enc).sample, target)
        loss.backward()
        opt.step()
        return loss
    return step


def _lora(device):
    from peft import LoraConfig, get_peft_model
    model = build("llama", "sdpa", "cpu")
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                             lora_dropout=0.0)).to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    return train_step_fn(model, batch("llama", device), params)


def _generate(kind, device, experts=None):
    model = build(kind, "sdpa", device).eval()
    if experts is not None:
        model.set_experts_implementation(experts)
    ids = batch(kind, device)["input_ids"][:, :8]

    def gen():
        with torch.no_grad():
            return model.generate(input_ids=ids, max_new_tokens=GEN_TOKENS, min_new_tokens=GEN_TOKENS,
                                  do_sample=False, pad_token_id=0)
    return gen


def rows_for(selected):
    """(row name, {device: zero-arg factory returning the timed callable}) in report order."""
    rows = []
    for kind in MODELS:
        if kind not in selected:
            continue
        rows.append((f"{kind} construct + .to()",
                     {d: (lambda d=d, k=kind: (lambda: build(k, "sdpa", d))) for d in ("cpu", "npu")}))
        for attn in ATTN_IMPLS:
            if attn == "flash_attention_2" and kind not in FLASH_MODELS:
                continue
            cpu_attn = "sdpa" if attn == "flash_attention_2" else attn
            label = attn if attn != "flash_attention_2" else "flash_attention_2 (npu) vs sdpa (cpu)"
            rows.append((f"{kind} train [{label}]",
                         {"cpu": lambda k=kind, a=cpu_attn: train_step_fn(build(k, a, "cpu"), batch(k, "cpu")),
                          "npu": lambda k=kind, a=attn: train_step_fn(build(k, a, "npu"), batch(k, "npu"))}))
        if kind == "llama":
            # the emulation's share of the flash row: the same transformers flash path, whose
            # npu_fusion_attention also runs on CPU tensors (the op is a CPU composite)
            rows.append((f"{kind} train [flash_attention_2] npu vs the same path on CPU tensors",
                         {d: (lambda d=d, k=kind: train_step_fn(build(k, "flash_attention_2", d), batch(k, d)))
                          for d in ("cpu", "npu")}))
        if kind != "bert":
            rows.append((f"{kind} generate {GEN_TOKENS} tokens",
                         {d: (lambda d=d, k=kind: _generate(k, d)) for d in ("cpu", "npu")}))
        if kind == "mixtral":
            # transformers decodes MoE experts with "batched_mm" on every device but the CPU
            # (generation/utils.py _optimize_model_for_decode), which copies the selected experts'
            # weights; the CPU keeps "grouped_mm". The emulation's share: both on batched_mm.
            rows.append((f"{kind} generate {GEN_TOKENS} tokens npu vs the same path (batched_mm experts) "
                         f"on CPU tensors",
                         {d: (lambda d=d, k=kind: _generate(k, d, "batched_mm")) for d in ("cpu", "npu")}))
    if "unet" in selected:
        rows.append(("diffusers UNet2DConditionModel train", {d: (lambda d=d: _unet(d)) for d in ("cpu", "npu")}))
    if "lora" in selected:
        rows.append(("peft LoRA (llama) train", {d: (lambda d=d: _lora(d)) for d in ("cpu", "npu")}))
    return rows


def _first_value(fn):
    """A comparable number from one call (the loss, or the generated ids' sum); None otherwise."""
    out = fn()
    if isinstance(out, torch.Tensor):
        return out.detach().double().sum().item()
    return None


# --------------------------------------------------------------------------
# harness
# --------------------------------------------------------------------------

def run_rows(prof, args, results):
    reps = args.reps or prof["reps"]
    selected = {s.strip() for s in args.only.split(",") if s.strip()}
    unknown = selected - set(MODELS) - set(EXTRAS)
    if unknown:
        raise SystemExit("unknown --only entries: %s (choose from %s)" % (sorted(unknown), MODELS + EXTRAS))
    out = []
    for name, factories in rows_for(selected):
        rec = {"name": name}
        t0 = time.perf_counter()
        try:
            fns = {d: factories[d]() for d in ("cpu", "npu")}
            first = {d: _first_value(fns[d]) for d in ("cpu", "npu")}
            if first["cpu"] is not None and first["npu"] is not None:
                rec["first_abs_diff"] = abs(first["cpu"] - first["npu"])
            variants = [T.Variant("cpu", fns["cpu"]), T.Variant("npu", fns["npu"], sync=npu_sync)]
            inner = T.calibrate_inner(variants, prof["rep_s"], max_inner=20)
            def precise(smp):
                lo, hi = smp.ratio_ci("cpu", "npu")
                mid = smp.median_us("npu") / smp.median_us("cpu")
                return hi - lo <= 2 * prof["ci"] * mid

            s = T.time_interleaved(variants, reps=reps, inner=inner, warmup=prof["warmup"],
                                   max_seconds=prof["cap_s"], min_reps=5,
                                   max_reps=max(reps, prof["max_reps"]) if not args.reps else None,
                                   precise=precise if not args.reps else None)
            lo, hi = s.ratio_ci("cpu", "npu")
            cpu_ms, npu_ms = s.median_us("cpu") / 1e3, s.median_us("npu") / 1e3
            rec.update(cpu_ms=cpu_ms, npu_ms=npu_ms, ratio=npu_ms / cpu_ms,
                       paired_ratio=s.paired_ratio("cpu", "npu"),
                       min_ratio=s.min_us("npu") / s.min_us("cpu"),
                       cpu_iqr_rel=s.iqr_rel("cpu"), npu_iqr_rel=s.iqr_rel("npu"),
                       ratio_ci=[lo, hi], inner=s.inner, reps=s.reps)
            rec["status"] = "PASS" if rec["ratio"] <= ROW_TARGET else "FAIL"
        except Exception as e:  # report, don't die
            rec["error"] = f"{type(e).__name__}: {e}"
            rec["traceback"] = traceback.format_exc()
        rec["wall_s"] = time.perf_counter() - t0
        out.append(rec)
        print(f"<!-- {name} done in {rec['wall_s']:.1f}s -->", flush=True)
    results["rows"] = out
    return out


def report(rows):
    print("\n## Client workloads: npu / native CPU\n")
    print("| workload | CPU ms | npu ms | **ratio** | 95% CI | paired ratio | min ratio | IQR cpu / npu | status | "
          "N×reps | first-call |Δ| |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|:---:|---:|---:|")
    ok = []
    for r in rows:
        if "error" in r:
            print(f"| {r['name']} | - | - | ERROR: `{r['error'][:200]}` | | | | | ERROR | | |")
            continue
        ok.append(r["ratio"])
        d = r.get("first_abs_diff")
        lo, hi = r["ratio_ci"]
        print(f"| {r['name']} | {r['cpu_ms']:.2f} | {r['npu_ms']:.2f} | **{r['ratio']:.3f}** | "
              f"{lo:.3f}–{hi:.3f} | {r['paired_ratio']:.3f} | {r['min_ratio']:.3f} | {100 * r['cpu_iqr_rel']:.1f}% / "
              f"{100 * r['npu_iqr_rel']:.1f}% | {r['status']} | {r['inner']}×{r['reps']} | "
              f"{'-' if d is None else f'{d:.2g}'} |")
    geo = math.exp(sum(math.log(x) for x in ok) / len(ok)) if ok else float("nan")
    status = "PASS" if geo <= GEOMEAN_TARGET else "FAIL"
    print(f"\n**geometric mean of {len(ok)} ratios: {geo:.3f}** (target ≤ {GEOMEAN_TARGET}: {status}); "
          f"rows over {ROW_TARGET}: {sum(1 for x in ok if x > ROW_TARGET)}; errors: {len(rows) - len(ok)}")
    for r in rows:
        if "error" in r:
            print(f"\n<details><summary>{r['name']} traceback</summary>\n\n```\n{r['traceback']}```\n</details>")
    return geo


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="short run (a few minutes)")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads value (default 1)")
    p.add_argument("--only", default=",".join(MODELS + EXTRAS),
                   help="comma list of: %s (default all)" % ",".join(MODELS + EXTRAS))
    p.add_argument("--reps", type=int, help="override the number of reps per row")
    p.add_argument("--json", metavar="PATH", help="also write results as JSON to PATH")
    p.add_argument("--malloc", choices=["tuned", "stock"], default="tuned",
                   help="CPU-side glibc malloc tuning, as bench/run.py (default tuned)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    prof_name = "quick" if args.quick else "full"
    prof = PROFILES[prof_name]
    malloc = T.tune_malloc(args.malloc)
    torch.set_num_threads(args.threads)
    import transformers
    transformers.logging.set_verbosity_error()
    t0 = time.perf_counter()
    la = os.getloadavg()
    print("# torch_npu (emulated) client-workload benchmark\n")
    print(f"- date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}")
    print(f"- torch {torch.__version__} | transformers {transformers.__version__} | threads "
          f"{torch.get_num_threads()} | os.cpu_count() {os.cpu_count()} | python {platform.python_version()} | "
          f"profile {prof_name} | CPU-side allocator: {malloc}")
    print(f"- load average at start: {la[0]:.2f} {la[1]:.2f} {la[2]:.2f} (other processes add noise)", flush=True)
    results = {"meta": {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                        "torch": torch.__version__, "transformers": transformers.__version__,
                        "threads": torch.get_num_threads(), "profile": prof_name, "argv": sys.argv[1:]}}
    rows = run_rows(prof, args, results)
    results["geomean"] = report(rows)
    total = time.perf_counter() - t0
    print(f"\n_load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}_")
    print(f"_total bench wall time: {total:.1f} s_")
    if args.json:
        T.write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
