"""mHC (manifold-constrained hyper-connections): npu_mhc_sinkhorn, npu_mhc_post,
npu_mhc_post_backward.

npu_mhc_sinkhorn, x [B, S, n, n] or [T, n, n] (documented formula):

    norm[0] = softmax(x, -1)                                              (stored as is)
    sum[1] = (norm[0] + eps).sum(-2) + eps; norm[1] = (norm[0] + eps) / sum[1]  (columns)
    for i in 1 .. num_iters-1:
        sum[2i] = norm[2i-1].sum(-1) + eps;  norm[2i] = norm[2i-1] / sum[2i]   (rows)
        sum[2i+1] = norm[2i].sum(-2) + eps;  norm[2i+1] = norm[2i] / sum[2i+1]
    y = norm[2 num_iters - 1]

With out_flag=1 the intermediates come back in the documented layouts norm_out
[2 num_iters, n, n, B, S] ([.., T]) and sum_out [2 num_iters, n, B, S]; the formula defines no
sum[0], so sum_out[0] is NaN here (never a plausible-looking made-up value). With out_flag=0
both are empty tensors (the docs only say they are not valid then).

npu_mhc_post (the op-plugin golden): y[.., j, :] = h_post[.., j] * h_out[..] +
sum_i h_res[.., i, j] * x[.., i, :], computed in float32, returned in x's dtype.
npu_mhc_post_backward returns its gradients (grad_x, grad_h_res, grad_h_out, grad_h_post):
grad_x / grad_h_out in x's dtype, grad_h_res / grad_h_post float32. ``h_res=None`` raises
NotImplementedError: the docs do not say what the op computes without it.

dtypes as documented (x float16/bfloat16, h_* float32; sinkhorn float32); float64
everywhere is also accepted so that gradcheck can run on the emulator.
"""
import torch

from torch_npu.op_plugin._common import check
from torch_npu.op_plugin._registry import impl

__all__ = []


def _move_batch_last(t, lead):
    """[K, *batch, *rest] -> [K, *rest, *batch] (batch = ``lead`` dims after the first)."""
    order = [0] + list(range(1 + lead, t.dim())) + list(range(1, 1 + lead))
    return t.permute(order)


@impl("npu_mhc_sinkhorn")
def npu_mhc_sinkhorn(x, *, eps=1e-6, num_iters=20, out_flag=0):
    """Sinkhorn normalisation of each [n, n] matrix of ``x`` (see the module docstring).
    Returns (y, norm_out, sum_out)."""
    op = "npu_mhc_sinkhorn"
    check(x.dim() in (3, 4), op, "x must be [B, S, n, n] or [T, n, n], got %d-D" % x.dim())
    n = x.shape[-1]
    check(x.shape[-2] == n and n in (4, 6, 8), op, "the last two dims must be n x n with n in 4, 6, 8, got %s"
          % (tuple(x.shape[-2:]),))
    check(x.dtype in (torch.float32, torch.float64), op, "x dtype must be float32, got %s" % x.dtype)
    check(1 <= num_iters <= 100, op, "num_iters must be in [1, 100], got %s" % num_iters)
    check(out_flag in (0, 1), op, "out_flag must be 0 or 1, got %s" % out_flag)
    probs = torch.softmax(x, dim=-1)
    y = probs + eps
    # norm[0] holds the softmax itself: npu_mhc_sinkhorn_backward (op-plugin's golden) reads it as
    # the softmax probabilities, so storing softmax + eps would skew every gradient by O(eps)
    norms, sums = [probs], [None]
    col = y.sum(-2, keepdim=True) + eps
    y = y / col
    norms.append(y)
    sums.append(col.squeeze(-2))
    for _ in range(1, num_iters):
        row = y.sum(-1, keepdim=True) + eps
        y = y / row
        norms.append(y)
        sums.append(row.squeeze(-1))
        col = y.sum(-2, keepdim=True) + eps
        y = y / col
        norms.append(y)
        sums.append(col.squeeze(-2))
    if out_flag == 0:
        return y, x.new_empty((0,)), x.new_empty((0,))
    sums[0] = torch.full_like(sums[1], float("nan"))  # not defined by the documented formula
    lead = x.dim() - 2
    norm_out = _move_batch_last(torch.stack(norms), lead).contiguous()
    sum_out = _move_batch_last(torch.stack(sums), lead).contiguous()
    return y, norm_out, sum_out


def _check_post(op, x, h_res, h_out, h_post):
    check(x.dim() in (3, 4), op, "x dim must be 3 or 4")
    check(x.dtype in (torch.float16, torch.bfloat16, torch.float64), op, "x dtype must be FLOAT16 or BFLOAT16")
    h_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    check(h_post.dtype == h_dtype, op, "h_post dtype must be FLOAT32")
    check(h_out.dtype == x.dtype, op, "h_out dtype must be the same as x dtype")
    lead, n, d = tuple(x.shape[:-2]), x.shape[-2], x.shape[-1]
    check(tuple(h_out.shape) == lead + (d,), op, "h_out shape must be %s, got %s" % (lead + (d,), tuple(h_out.shape)))
    check(tuple(h_post.shape) == lead + (n,), op, "h_post shape must be %s, got %s" % (lead + (n,), tuple(h_post.shape)))
    if h_res is None:
        raise NotImplementedError("%s: h_res=None is not emulated (what the op computes without h_res is not "
                                  "documented)" % op)
    check(h_res.dtype == h_dtype, op, "h_res dtype must be FLOAT32")
    check(tuple(h_res.shape) == lead + (n, n), op, "h_res shape must be %s, got %s"
          % (lead + (n, n), tuple(h_res.shape)))
    return h_dtype


@impl("npu_mhc_post")
def npu_mhc_post(x, h_res, h_out, h_post):
    """x_{l+1}[.., j, :] = h_post[.., j] h_out + sum_i h_res[.., i, j] x[.., i, :]; x (B, S, n, D) or
    (T, n, D). Returns it in x's dtype."""
    cdt = _check_post("npu_mhc_post", x, h_res, h_out, h_post)
    y = torch.einsum("...ij,...id->...jd", h_res.to(cdt), x.to(cdt))
    y = y + h_post.to(cdt).unsqueeze(-1) * h_out.to(cdt).unsqueeze(-2)
    return y.to(x.dtype)


@impl("npu_mhc_post_backward")
def npu_mhc_post_backward(grad_y, x, h_res, h_out, h_post):
    """Gradients of npu_mhc_post: (grad_x, grad_h_res, grad_h_out, grad_h_post)."""
    op = "npu_mhc_post_backward"
    cdt = _check_post(op, x, h_res, h_out, h_post)
    check(tuple(grad_y.shape) == tuple(x.shape), op, "grad_y shape must be the same as x shape")
    g = grad_y.to(cdt)
    grad_x = torch.einsum("...ij,...jd->...id", h_res.to(cdt), g)
    grad_h_res = torch.einsum("...id,...jd->...ij", x.to(cdt), g)
    grad_h_out = torch.einsum("...j,...jd->...d", h_post.to(cdt), g)
    grad_h_post = torch.einsum("...d,...jd->...j", h_out.to(cdt), g)
    return grad_x.to(x.dtype), grad_h_res, grad_h_out.to(x.dtype), grad_h_post
