"""Batch-norm statistics ops.

* ``batch_norm_gather_stats_update``: SyncBatchNorm's statistics merge (``torch.batch_norm_gather_stats_with_counts``)
  plus the running mean / variance update.

Meta-only (the computation is not documented precisely enough to emulate): ``batch_norm_reduce``
and ``npu_normalize_batch``.
"""
import torch

from torch_npu.op_plugin._registry import impl, meta

__all__ = []


@impl("batch_norm_gather_stats_update")
def batch_norm_gather_stats_update(input, mean, invstd, running_mean, running_var, momentum, eps, counts):
    """Merges per-rank batch statistics (rows of ``mean``/``invstd``, ``counts`` elements each)
    into the global ``(mean, invstd)`` as ``torch.batch_norm_gather_stats_with_counts`` does:
    ``mean = sum(c_i * mean_i) / N``, ``var = sum(c_i * (1/invstd_i^2 - eps + (mean_i - mean)^2)) / N``,
    ``invstd = 1 / sqrt(var + eps)``; ``running_mean``/``running_var`` (if given) are updated in
    place with ``momentum``, the running variance unbiased (``var * N / (N - 1)``)."""
    c = counts.to(torch.float32 if mean.dtype != torch.float64 else torch.float64).reshape(-1, 1)
    m = mean.to(c.dtype)
    var_i = 1.0 / invstd.to(c.dtype) ** 2 - eps
    total = c.sum()
    g_mean = (c * m).sum(0) / total
    g_var = (c * (var_i + (m - g_mean) ** 2)).sum(0) / total
    g_invstd = 1.0 / torch.sqrt(g_var + eps)
    with torch.no_grad():
        if running_mean is not None:
            running_mean.mul_(1 - momentum).add_(g_mean.to(running_mean.dtype) * momentum)
        if running_var is not None:
            unbiased = g_var * total / (total - 1)
            running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype) * momentum)
    return g_mean.to(mean.dtype), g_invstd.to(invstd.dtype)


@meta("batch_norm_reduce")
def batch_norm_reduce_meta(input, eps):
    """Per-channel (dim 1) statistics: two float32 vectors of ``C`` elements."""
    torch._check(input.dim() >= 2, lambda: "batch_norm_reduce: input must have a channel dim")
    c = input.shape[1]
    return input.new_empty((c,), dtype=torch.float32), input.new_empty((c,), dtype=torch.float32)


@meta("npu_normalize_batch")
def npu_normalize_batch_meta(self, seq_len, normalize_type=0):
    torch._check(self.dim() == 3, lambda: "npu_normalize_batch: self must be (n, c, d)")
    torch._check(seq_len.dim() == 1 and seq_len.shape[0] == self.shape[0],
                 lambda: "seq_len's length should be equal self' num")
    torch._check(normalize_type in (0, 1), lambda: "normalize_type expected to be in range [0, 1]")
    return torch.empty_like(self)
