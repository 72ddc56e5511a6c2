"""npu_ring_attention_update: merge two partial FlashAttention results (ring / context parallel).

Documented equivalent computation (per query row and head)::

    m   = max(prev_max, cur_max)
    sp  = prev_sum * exp(prev_max - m);  sc = cur_sum * exp(cur_max - m)
    sum = sp + sc
    out = prev_out * sp / sum + cur_out * sc / sum

Layouts: ``SBH`` (outputs [S, B, N*D], statistics [B, N, S, 8] as npu_fusion_attention
returns them) and ``TND`` (outputs [T, N, D], statistics [T, N, 8]).
"""
import torch

from torch_npu.op_plugin._common import acc, check, unsupported
from torch_npu.op_plugin._registry import impl

__all__ = []


@impl("npu_ring_attention_update")
def npu_ring_attention_update(prev_attn_out, prev_softmax_max, prev_softmax_sum, cur_attn_out, cur_softmax_max,
                              cur_softmax_sum, actual_seq_qlen=None, input_layout="SBH", input_softmax_layout=""):
    """Merges two partial attention results: ``m = max(prev_max, cur_max)``, ``sum =
    prev_sum * exp(prev_max - m) + cur_sum * exp(cur_max - m)``, ``out = (prev_out *
    prev_sum * exp(prev_max - m) + cur_out * cur_sum * exp(cur_max - m)) / sum``, computed in
    float32. ``input_layout`` SBH (out [S, B, N*D], statistics [B, N, S, 8]) or TND (out
    [T, N, D], statistics [T, N, 8]; ``actual_seq_qlen`` is accepted, the formula is per
    token). Returns ``(attn_out`` in prev_attn_out's dtype, ``softmax_max``, ``softmax_sum``
    float32 with the statistics' shape``)``. Other ``input_softmax_layout`` values raise
    NotImplementedError."""
    op = "npu_ring_attention_update"
    if input_softmax_layout not in ("",):
        unsupported(op, "input_softmax_layout %r" % (input_softmax_layout,))
    check(input_layout in ("SBH", "TND"), op, "input_layout must be SBH or TND, got %r", (input_layout,))
    check(prev_attn_out.shape == cur_attn_out.shape, op, "prev_attn_out %s and cur_attn_out %s shapes differ", (tuple(prev_attn_out.shape), tuple(cur_attn_out.shape)))
    for t in (prev_softmax_sum, cur_softmax_max, cur_softmax_sum):
        check(t.shape == prev_softmax_max.shape, op, "softmax statistics must share one shape, got %s and %s", (tuple(t.shape), tuple(prev_softmax_max.shape)))
    pm, ps, cm, cs = (acc(t).float() if t.dtype != torch.float64 else t
                      for t in (prev_softmax_max, prev_softmax_sum, cur_softmax_max, cur_softmax_sum))
    m = torch.maximum(pm, cm)
    sp = ps * torch.exp(pm - m)
    sc = cs * torch.exp(cm - m)
    total = sp + sc
    wp, wc = (sp / total)[..., 0], (sc / total)[..., 0]  # the 8 repeated values are equal
    if input_layout == "SBH":
        check(prev_attn_out.dim() == 3 and prev_softmax_max.dim() == 4, op,
              "SBH expects attn_out [S, B, H] and statistics [B, N, S, 8]")
        s, b, h = prev_attn_out.shape
        n = prev_softmax_max.shape[1]
        check(h % n == 0 and prev_softmax_max.shape[0] == b and prev_softmax_max.shape[2] == s, op,
              "statistics %s do not match attn_out %s", (tuple(prev_softmax_max.shape), tuple(prev_attn_out.shape)))
        # [B, N, S] -> [S, B, N, 1] to scale each head's D values
        wp = wp.permute(2, 0, 1).unsqueeze(-1)
        wc = wc.permute(2, 0, 1).unsqueeze(-1)
        po = acc(prev_attn_out).view(s, b, n, h // n)
        co = acc(cur_attn_out).view(s, b, n, h // n)
        out = (po * wp.to(po.dtype) + co * wc.to(co.dtype)).reshape(s, b, h)
    else:
        check(prev_attn_out.dim() == 3 and prev_softmax_max.dim() == 3, op,
              "TND expects attn_out [T, N, D] and statistics [T, N, 8]")
        check(prev_softmax_max.shape[:2] == prev_attn_out.shape[:2], op, "statistics %s do not match attn_out %s", (tuple(prev_softmax_max.shape), tuple(prev_attn_out.shape)))
        po, co = acc(prev_attn_out), acc(cur_attn_out)
        out = po * wp.unsqueeze(-1).to(po.dtype) + co * wc.unsqueeze(-1).to(co.dtype)
    return out.to(prev_attn_out.dtype), m.contiguous(), total.contiguous()
