"""npu_fused_attention_layernorm_qkv_fwd and npu_fused_attention_qkv_grad (BERT-era fused blocks
used by torch_npu.contrib's npu_fused_attention(_with_layernorm)).

Sources: op-plugin's allocation code, its ONNX export path of the forward and the contrib
module that chains both ops with npu_fused_attention_score(_grad) and npu_layernorm_grad.

npu_fused_attention_layernorm_qkv_fwd(x [B*S, H], kernel_query/key/value [H, H'], gamma, beta,
bias_*, seq_len=S, num_heads=N, eps):

    norm  = LayerNorm(x) over H with gamma, beta, eps        (x's dtype)
    query = (norm @ kernel_query + bias_query) as [B, S, N, D] permuted to [B, N, S, D]
            (D = H / N; key and value likewise; in the kernels' dtypes)
    mean  = row means of x [B*S];  variance = the rows' rstd = 1 / sqrt(var + eps) [B*S]

The sixth output is named variance but holds rstd: the ONNX export path returns
native_layer_norm's rstd there and the contrib backward passes it to npu_layernorm_grad as
rstd. mean / rstd come back in kernel_query's dtype, as op-plugin allocates them.

npu_fused_attention_qkv_grad(grad_q, grad_k, grad_v [B*S, H'], kernels, hidden_states [B*S, H],
grad_output_ln [B*S, H]) returns the gradients of ``q = hidden_states @ kernel + bias`` (the
kernels AttentionQKVGradX with trans_b and AttentionQKVGradW with trans_a):

    grad_hidden_states = grad_output_ln + sum_{q,k,v} grad @ kernel^T
    grad_kernel = hidden_states^T @ grad;  grad_bias = grad summed over rows

Computed in float32 (float64 stays float64).
"""
import torch

from torch_npu.op_plugin._common import acc, check
from torch_npu.op_plugin._registry import impl

__all__ = []


@impl("npu_fused_attention_layernorm_qkv_fwd")
def npu_fused_attention_layernorm_qkv_fwd(x, kernel_query, kernel_key, kernel_value, gamma, beta, bias_query=None,
                                          bias_key=None, bias_value=None, seq_len=128, num_heads=12, eps=1e-05):
    """[norm, query, key, value, mean, variance (= rstd)]; see the module docstring."""
    op = "npu_fused_attention_layernorm_qkv_fwd"
    check(seq_len != 0 or num_heads != 0, op, "seq_len and num_heads cannot be equal to 0.")
    check(x.dim() == 2, op, "x must be 2-D [B*S, H], got %d-D", x.dim())
    check(x.shape[0] % seq_len == 0 and x.shape[1] % num_heads == 0, op,
          "x.size(0) should be divisible by seq_len and x.size(1) should be divisible by num_heads.")
    rows, hidden = x.shape
    d = hidden // num_heads
    for name, k in (("kernel_query", kernel_query), ("kernel_key", kernel_key), ("kernel_value", kernel_value)):
        check(k.dim() == 2 and k.shape[0] == hidden and k.shape[1] == hidden, op,
              "%s must be [H=%d, H=%d], got %s", (name, hidden, hidden, tuple(k.shape)))
    check(tuple(gamma.shape) == (hidden,) and tuple(beta.shape) == (hidden,), op, "gamma and beta must be [H=%d]",
          hidden)
    xf = acc(x)
    mean = xf.mean(-1)
    rstd = torch.rsqrt(xf.var(-1, unbiased=False) + eps)
    norm = (xf - mean.unsqueeze(-1)) * rstd.unsqueeze(-1) * acc(gamma) + acc(beta)

    def project(kernel, bias):
        y = norm @ acc(kernel)
        if bias is not None:
            y = y + acc(bias)
        return y.reshape(rows // seq_len, seq_len, num_heads, d).permute(0, 2, 1, 3).contiguous().to(kernel.dtype)

    stat = kernel_query.dtype
    return [norm.to(x.dtype), project(kernel_query, bias_query), project(kernel_key, bias_key),
            project(kernel_value, bias_value), mean.to(stat), rstd.to(stat)]


@impl("npu_fused_attention_qkv_grad")
def npu_fused_attention_qkv_grad(grad_output_query, grad_output_key, grad_output_value, query_kernel, key_kernel,
                                 value_kernel, hidden_states, grad_output_ln):
    """[grad_hidden_states, grad_w_query, grad_w_key, grad_w_value, grad_b_query, grad_b_key, grad_b_value]."""
    op = "npu_fused_attention_qkv_grad"
    check(hidden_states.dim() == 2, op, "hidden_states must be 2-D [B*S, H], got %d-D", hidden_states.dim())
    rows = hidden_states.shape[0]
    check(tuple(grad_output_ln.shape) == tuple(hidden_states.shape), op, "grad_output_ln must be shaped like "
          "hidden_states %s", (tuple(hidden_states.shape),))
    grads, kernels = (grad_output_query, grad_output_key, grad_output_value), (query_kernel, key_kernel, value_kernel)
    for name, g, k in zip(("query", "key", "value"), grads, kernels):
        check(k.dim() == 2 and k.shape[0] == hidden_states.shape[1], op, "%s_kernel must be [H=%d, *], got %s",
              (name, hidden_states.shape[1], tuple(k.shape)))
        check(k.shape[0] == k.shape[1], op, "%s_kernel must be square (its bias gradient has kernel.size(0) "
              "entries)", name)
        check(tuple(g.shape) == (rows, k.shape[1]), op, "grad_output_%s must be [%d, %d], got %s",
              (name, rows, k.shape[1], tuple(g.shape)))
    h = acc(hidden_states)
    dx = acc(grad_output_ln)
    out_w, out_b = [], []
    for g, k in zip(grads, kernels):
        gf = acc(g)
        dx = dx + gf @ acc(k).transpose(0, 1)
        out_w.append((h.transpose(0, 1) @ gf).to(k.dtype))
        out_b.append(gf.sum(0).to(k.dtype))
    return [dx.to(hidden_states.dtype)] + out_w + out_b
