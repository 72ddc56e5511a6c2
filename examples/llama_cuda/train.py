"""A small LLaMA-style decoder trained on a text corpus, written for CUDA.

Nothing in this file knows about Ascend: it uses ``.cuda()``, ``nccl``, bf16
``torch.autocast("cuda")`` and ``torch.profiler`` with the CUDA activity, as a
CUDA training script does.  ``examples/demo.py`` runs it unchanged on two
virtual NPUs with ``TORCH_TRANSFER_TO_NPU=1 torch_npu_run --nproc-per-node 2``.

Launch:  torchrun --nproc-per-node 2 train.py --out-dir runs/x [--steps N]
         [--save-at K --ckpt ckpt.pt] [--resume ckpt.pt] [--profile-dir prof]

Writes, in --out-dir: ``losses.json`` (rank 0: step -> mean loss over the
ranks, as float.hex so runs can be compared bit for bit) and
``rank<r>.json`` (that card's peak memory).
"""
import argparse
import json
import math
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus.txt")

# name -> (width, layers, heads, context, batch per rank, steps)
SIZES = {
    "small": (128, 4, 4, 64, 8, 160),
    "tiny": (32, 2, 2, 32, 4, 40),
}


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rope_tables(head_dim, context, device, base=10000.0):
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim)
    angles = torch.outer(torch.arange(context, device=device).float(), inv_freq)
    return angles.cos(), angles.sin()


def apply_rope(x, cos, sin):
    # x: (batch, heads, time, head_dim); rotate pairs (even, odd).
    x1, x2 = x[..., 0::2], x[..., 1::2]
    t = x.shape[-2]
    cos, sin = cos[:t], sin[:t]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class Attention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x, cos, sin):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class SwiGLU(nn.Module):
    def __init__(self, dim):
        super().__init__()
        hidden = 64 * math.ceil(8 * dim / 3 / 64)
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.attn_norm, self.attn = RMSNorm(dim), Attention(dim, heads)
        self.mlp_norm, self.mlp = RMSNorm(dim), SwiGLU(dim)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


class Llama(nn.Module):
    def __init__(self, vocab, dim, layers, heads, context):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head_dim, self.context = dim // heads, context

    def forward(self, tokens):
        cos, sin = rope_tables(self.head_dim, self.context, tokens.device)
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.head(self.norm(x))


def load_corpus():
    with open(CORPUS, encoding="utf-8") as f:
        text = f.read()
    vocab = sorted(set(text))
    index = {ch: i for i, ch in enumerate(vocab)}
    return torch.tensor([index[ch] for ch in text], dtype=torch.long), len(vocab)


def batch_for(data, step, rank, batch, context):
    """The batch of (step, rank) depends on nothing else: resuming needs no sampler state."""
    g = torch.Generator().manual_seed(1_000_003 * step + rank)
    starts = torch.randint(0, len(data) - context - 1, (batch,), generator=g)
    x = torch.stack([data[s:s + context] for s in starts.tolist()])
    y = torch.stack([data[s + 1:s + context + 1] for s in starts.tolist()])
    return x, y


def lr_at(step, total, peak=3e-3, warmup=10):
    if step < warmup:
        return peak * (step + 1) / warmup
    return 0.1 * peak + 0.9 * peak * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))


class Progress:
    """A progress bar on a terminal, a line every tenth of the run otherwise."""

    def __init__(self, total, first):
        self.total, self.first, self.start = total, first, time.perf_counter()
        self.tty = sys.stdout.isatty()

    def update(self, step, loss):
        done = step - self.first
        rate = (time.perf_counter() - self.start) / max(1, done)
        width = 30
        filled = width * step // self.total
        line = (f"  [{'#' * filled}{'.' * (width - filled)}] step {step:4d}/{self.total}"
                f"  loss {loss:.4f}  {rate:.2f} s/step")
        if self.tty:
            print("\r" + line, end="\n" if step == self.total else "", flush=True)
        elif step == self.total or step % max(1, self.total // 10) == 0:
            print(line, flush=True)


def save_checkpoint(path, model, opt, step):
    state = {"model": model.module.state_dict(), "optimizer": opt.state_dict(), "step": step,
             "cpu_rng": torch.get_rng_state(), "cuda_rng": torch.cuda.get_rng_state_all()}
    tmp = path + ".tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)  # the checkpoint appears complete or not at all


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--save-at", type=int, default=None)
    parser.add_argument("--ckpt", default=None)
    parser.add_argument("--resume", default=None)
    parser.add_argument("--profile-dir", default=None)
    args = parser.parse_args()
    dim, layers, heads, context, batch, steps = SIZES[args.size]
    steps = args.steps or steps

    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    data, vocab = load_corpus()
    torch.manual_seed(0)
    model = Llama(vocab, dim, layers, heads, context).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=lr_at(0, steps), betas=(0.9, 0.95), weight_decay=0.1)
    first = 0
    if args.resume:
        state = torch.load(args.resume, map_location=f"cuda:{local_rank}")
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        # map_location moved the RNG states to the GPU too; the setters take CPU byte tensors.
        torch.set_rng_state(state["cpu_rng"].cpu())
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda_rng"]])
        first = state["step"]
    model = DDP(model, device_ids=[local_rank])

    profiler = None
    if args.profile_dir:
        profiler = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA],
            schedule=torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=1),
            on_trace_ready=torch.profiler.tensorboard_trace_handler(args.profile_dir),
            profile_memory=True)
        profiler.start()

    if rank == 0:
        what = f"resuming at step {first}" if first else "from scratch"
        print(f"  {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters, {world} ranks on "
              f"{torch.cuda.get_device_name(local_rank)}, bf16 autocast, {what}", flush=True)
    progress = Progress(steps, first) if rank == 0 else None
    losses = {}
    torch.cuda.reset_peak_memory_stats()
    for step in range(first, steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps)
        x, y = batch_for(data, step, rank, batch, context)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(x)
        loss = F.cross_entropy(logits.float().view(-1, vocab), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)
        mean_loss = mean_loss.item() / world
        if profiler is not None:
            profiler.step()
        if rank == 0:
            losses[step + 1] = mean_loss.hex()
            progress.update(step + 1, mean_loss)
        if args.save_at == step + 1:
            if rank == 0:
                save_checkpoint(args.ckpt, model, opt, step + 1)
            dist.barrier()
    if profiler is not None:
        profiler.stop()

    os.makedirs(args.out_dir, exist_ok=True)
    if rank == 0:
        with open(os.path.join(args.out_dir, "losses.json"), "w") as f:
            json.dump(losses, f)
    with open(os.path.join(args.out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"device": str(next(model.parameters()).device),  # where .cuda() put the model
                   "max_memory_allocated": torch.cuda.max_memory_allocated(),
                   "max_memory_reserved": torch.cuda.max_memory_reserved()}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
