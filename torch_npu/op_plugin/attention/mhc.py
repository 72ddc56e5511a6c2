"""mHC (manifold-constrained hyper-connections): npu_mhc_pre, npu_mhc_sinkhorn, npu_mhc_post and
their backward ops (npu_mhc_pre_backward, npu_mhc_sinkhorn_backward, npu_mhc_post_backward).

npu_mhc_pre, documented formula, x [B, S, n, D] or [T, n, D] (bfloat16 / float16), phi [n^2+2n, nD],
alpha [3], bias [n^2+2n], gamma [n, D] (all float32), per token with xf = x.flatten(n, D):

    inv_rms = 1 / sqrt(mean(xf^2) + norm_eps)
    h_mix   = (xf * gamma) @ phi^T                       (gamma = 1 when absent)
    w       = h_mix * inv_rms = [w_pre (n) | w_post (n) | w_res (n^2)]
    h_pre   = sigmoid(alpha[0] * w_pre + bias[:n]) + hc_eps
    h_post  = 2 sigmoid(alpha[1] * w_post + bias[n:2n])
    h_res   = alpha[2] * w_res + bias[2n:]               (shaped [n, n], before Sinkhorn)
    h_in    = sum_i h_pre[i] * x[i, :]

npu_mhc_pre returns (h_in in x's dtype, h_post, h_res, inv_rms, h_mix, h_pre), the last three
only with out_flag=1 (empty float32 tensors otherwise: the docs only say they are not output).
The docs list h_post as (B, S, D) / (T, D); the formula gives n values per token, so it is
(B, S, n) / (T, n) here (as the op-plugin golden computes it).

npu_mhc_pre_backward computes, from the forward's saved inv_rms / h_mix / h_pre / h_post
(as the kernel does; bias is not an input), the gradients (grad_x in x's dtype, grad_phi,
grad_alpha, grad_bias, grad_gamma float32) of h_in / h_post / h_res, plus grad_x_post added to
grad_x; grad_gamma is zeros [n, D] without gamma. float64 everywhere is accepted for gradcheck.

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
    check(x.dim() in (3, 4), op, "x must be [B, S, n, n] or [T, n, n], got %d-D", x.dim())
    n = x.shape[-1]
    check(x.shape[-2] == n and n in (4, 6, 8), op, "the last two dims must be n x n with n in 4, 6, 8, got %s", (tuple(x.shape[-2:]),))
    check(x.dtype in (torch.float32, torch.float64), op, "x dtype must be float32, got %s", x.dtype)
    check(1 <= num_iters <= 100, op, "num_iters must be in [1, 100], got %s", num_iters)
    check(out_flag in (0, 1), op, "out_flag must be 0 or 1, got %s", out_flag)
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
    check(tuple(h_out.shape) == lead + (d,), op, "h_out shape must be %s, got %s", (lead + (d,), tuple(h_out.shape)))
    check(tuple(h_post.shape) == lead + (n,), op, "h_post shape must be %s, got %s", (lead + (n,), tuple(h_post.shape)))
    if h_res is None:
        raise NotImplementedError("%s: h_res=None is not emulated (what the op computes without h_res is not "
                                  "documented)" % op)
    check(h_res.dtype == h_dtype, op, "h_res dtype must be FLOAT32")
    check(tuple(h_res.shape) == lead + (n, n), op, "h_res shape must be %s, got %s", (lead + (n, n), tuple(h_res.shape)))
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


def _check_common(op, x, phi, alpha, gamma, inner_precise):
    check(x.dim() in (3, 4), op, "x must be [B, S, n, D] or [T, n, D], got %d-D", x.dim())
    check(x.dtype in (torch.bfloat16, torch.float16, torch.float64), op,
          "x dtype must be bfloat16 or float16, got %s", x.dtype)
    n, d = x.shape[-2], x.shape[-1]
    check(n in (4, 6, 8), op, "n must be 4, 6 or 8, got %d", n)
    check(d % 16 == 0 and 1 <= d <= 16384, op, "D must be a multiple of 16 in [16, 16384], got %d", d)
    fdt = torch.float64 if x.dtype == torch.float64 else torch.float32
    check(phi.dtype == fdt and tuple(phi.shape) == (n * n + 2 * n, n * d), op,
          "phi must be float32 [n^2+2n=%d, nD=%d], got %s %s", (n * n + 2 * n, n * d, phi.dtype, tuple(phi.shape)))
    check(alpha.dtype == fdt and tuple(alpha.shape) == (3,), op, "alpha must be float32 [3]")
    if gamma is not None:
        check(gamma.dtype == fdt and tuple(gamma.shape) == (n, d), op, "gamma must be float32 [n=%d, D=%d]", (n, d))
    if inner_precise != 0:
        raise NotImplementedError("%s: inner_precise=%r is not emulated (only 0; its modes are not documented)"
                                  % (op, inner_precise))
    return n, d, fdt


@impl("npu_mhc_pre")
def npu_mhc_pre(x, phi, alpha, bias, *, gamma=None, norm_eps=1e-6, hc_eps=1e-6, out_flag=0, inner_precise=0):
    op = "npu_mhc_pre"
    n, d, fdt = _check_common(op, x, phi, alpha, gamma, inner_precise)
    check(bias.dtype == fdt and tuple(bias.shape) == (n * n + 2 * n,), op, "bias must be float32 [n^2+2n]")
    check(out_flag in (0, 1), op, "out_flag must be 0 or 1, got %s", out_flag)
    lead = tuple(x.shape[:-2])
    xf = x.to(fdt).reshape(lead + (n * d,))
    inv_rms = torch.rsqrt(xf.square().mean(-1) + norm_eps)
    xg = xf if gamma is None else xf * gamma.reshape(n * d)
    h_mix = torch.matmul(xg, phi.t())
    w = h_mix * inv_rms.unsqueeze(-1)
    h_pre = torch.sigmoid(alpha[0] * w[..., :n] + bias[:n]) + hc_eps
    h_post = 2 * torch.sigmoid(alpha[1] * w[..., n:2 * n] + bias[n:2 * n])
    h_res = (alpha[2] * w[..., 2 * n:] + bias[2 * n:]).reshape(lead + (n, n))
    h_in = (h_pre.unsqueeze(-1) * x.to(fdt)).sum(-2).to(x.dtype)
    if out_flag == 0:
        empty = x.new_empty((0,), dtype=fdt)
        return h_in, h_post, h_res, empty, empty.clone(), empty.clone()
    return h_in, h_post, h_res, inv_rms, h_mix, h_pre


@impl("npu_mhc_pre_backward")
def npu_mhc_pre_backward(x, phi, alpha, grad_h_in, grad_h_post, grad_h_res, inv_rms, h_mix, h_pre, h_post,
                         gamma=None, hc_eps=1e-6, grad_x_post=None, inner_precise=0):
    op = "npu_mhc_pre_backward"
    n, d, fdt = _check_common(op, x, phi, alpha, gamma, inner_precise)
    lead = tuple(x.shape[:-2])
    for name, t, shape in (("grad_h_in", grad_h_in, lead + (d,)), ("grad_h_post", grad_h_post, lead + (n,)),
                           ("grad_h_res", grad_h_res, lead + (n, n)), ("inv_rms", inv_rms, lead),
                           ("h_mix", h_mix, lead + (n * n + 2 * n,)), ("h_pre", h_pre, lead + (n,)),
                           ("h_post", h_post, lead + (n,))):
        check(tuple(t.shape) == shape, op, "%s must be %s, got %s", (name, shape, tuple(t.shape)))
    xs = x.to(fdt)
    xf = xs.reshape(lead + (n * d,))
    g_in = grad_h_in.to(fdt)
    # h_in = sum_i h_pre[i] x[i]
    grad_x = h_pre.to(fdt).unsqueeze(-1) * g_in.unsqueeze(-2)
    d_hpre = (g_in.unsqueeze(-2) * xs).sum(-1)
    s_pre = h_pre.to(fdt) - hc_eps
    s_post = h_post.to(fdt) / 2
    dz = torch.cat([d_hpre * s_pre * (1 - s_pre), grad_h_post.to(fdt) * 2 * s_post * (1 - s_post),
                    grad_h_res.to(fdt).reshape(lead + (n * n,))], dim=-1)
    w = h_mix.to(fdt) * inv_rms.to(fdt).unsqueeze(-1)
    tokens = tuple(range(len(lead)))
    parts = (slice(0, n), slice(n, 2 * n), slice(2 * n, None))
    grad_alpha = torch.stack([(dz[..., p] * w[..., p]).sum(tokens).sum() for p in parts])
    grad_bias = dz.sum(tokens)
    scale = torch.cat([alpha[0].expand(n), alpha[1].expand(n), alpha[2].expand(n * n)]).to(fdt)
    dw = dz * scale
    d_hmix = dw * inv_rms.to(fdt).unsqueeze(-1)
    d_inv = (dw * h_mix.to(fdt)).sum(-1)
    g_flat = None if gamma is None else gamma.to(fdt).reshape(n * d)
    xg = xf if g_flat is None else xf * g_flat
    grad_phi = torch.einsum("...k,...j->kj", d_hmix, xg)
    d_xg = torch.matmul(d_hmix, phi.to(fdt))
    if g_flat is None:
        grad_gamma = torch.zeros(n, d, dtype=fdt, device=x.device)
        d_xf = d_xg
    else:
        grad_gamma = (d_xg * xf).sum(tokens).reshape(n, d)
        d_xf = d_xg * g_flat
    # inv_rms = (mean(xf^2) + eps)^(-1/2): d inv_rms / d xf = -inv_rms^3 xf / (nD)
    r = inv_rms.to(fdt).unsqueeze(-1)
    d_xf = d_xf - d_inv.unsqueeze(-1) * r.pow(3) * xf / (n * d)
    grad_x = grad_x + d_xf.reshape(xs.shape)
    if grad_x_post is not None:
        check(tuple(grad_x_post.shape) == tuple(x.shape), op, "grad_x_post must be shaped like x")
        grad_x = grad_x + grad_x_post.to(fdt)
    return grad_x.to(x.dtype), grad_phi, grad_alpha, grad_bias, grad_gamma


@impl("npu_mhc_sinkhorn_backward")
def npu_mhc_sinkhorn_backward(grad_y, norm, sum):
    """Gradient w.r.t. x of npu_mhc_sinkhorn's y for ``grad_y`` ([B, S, n, n] or [T, n, n]), from the
    forward's intermediates norm [2K, n, n, *batch] and sum [2K, n, *batch] (K = num_iters; the
    documented out_flag=1 layouts). As the op-plugin golden, backwards through the K-1 (column,
    row) normalisation pairs, the first column normalisation, then the softmax:

        column step k: g = (g - sum_rows(g * norm[k])) / sum[k]   (sum[k] per column)
        row step k:    g = (g - sum_cols(g * norm[k])) / sum[k]   (sum[k] per row)
        grad_x = norm[0] * (g - sum_cols(g * norm[0]))

    norm[0] is used as the softmax probabilities (the golden stores softmax(x) there; sum[0]
    is not read). Returns float32 (float64 stays float64) shaped like grad_y."""
    op = "npu_mhc_sinkhorn_backward"
    check(grad_y.dim() in (3, 4), op, "grad_y must be [B, S, n, n] or [T, n, n], got %d-D", grad_y.dim())
    n = grad_y.shape[-1]
    batch = tuple(grad_y.shape[:-2])
    check(grad_y.shape[-2] == n, op, "grad_y's last two dims must be n x n")
    check(norm.dim() == 3 + len(batch) and tuple(norm.shape[1:]) == (n, n) + batch and norm.shape[0] % 2 == 0
          and norm.shape[0] >= 2, op, "norm must be [2*num_iters, n, n, %s], got %s", (", ".join(map(str, batch)), tuple(norm.shape)))
    check(tuple(sum.shape) == (norm.shape[0], n) + batch, op, "sum must be %s, got %s", ((norm.shape[0], n) + batch, tuple(sum.shape)))
    cdt = torch.float64 if grad_y.dtype == torch.float64 else torch.float32
    lead = len(batch)
    # [2K, n, n, *batch] -> [2K, *batch, n, n];  [2K, n, *batch] -> [2K, *batch, n]
    norms = norm.to(cdt).permute(0, *range(3, 3 + lead), 1, 2)
    sums = sum.to(cdt).permute(0, *range(2, 2 + lead), 1)
    iters = norm.shape[0] // 2
    g = grad_y.to(cdt)

    def col_step(g, k):
        return (g - (g * norms[k]).sum(-2, keepdim=True)) / sums[k].unsqueeze(-2)

    def row_step(g, k):
        return (g - (g * norms[k]).sum(-1, keepdim=True)) / sums[k].unsqueeze(-1)

    for i in range(iters - 1, 0, -1):
        g = row_step(col_step(g, 2 * i + 1), 2 * i)
    g = col_step(g, 1)
    p = norms[0]
    return p * (g - (g * p).sum(-1, keepdim=True))



