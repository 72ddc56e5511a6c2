"""Attention ops: npu_fusion_attention (FlashAttentionScore forward)."""
import torch

from torch_npu.op_plugin._common import acc, check, stat_dtype
from torch_npu.op_plugin._registry import impl

__all__ = []

_MAX_TOKENS = 2147483647
_LAYOUTS = ("BSH", "SBH", "BSND", "BNSD")


def _to_bnsd(op, x, layout, head_dim, what):
    """``x`` in ``layout`` -> a [B, N, S, D] view (N derived from the last dim for BSH/SBH)."""
    if layout in ("BSH", "SBH"):
        check(x.dim() == 3, op, "%s must be 3-D for layout %s, got %d-D" % (what, layout, x.dim()))
        h = x.shape[2]
        check(h % head_dim == 0, op, "%s hidden size %d is not a multiple of the head dim %d" % (what, h, head_dim))
        if layout == "BSH":
            b, s = x.shape[0], x.shape[1]
            return x.view(b, s, h // head_dim, head_dim).transpose(1, 2)
        s, b = x.shape[0], x.shape[1]
        return x.view(s, b, h // head_dim, head_dim).permute(1, 2, 0, 3)
    check(x.dim() == 4, op, "%s must be 4-D for layout %s, got %d-D" % (what, layout, x.dim()))
    check(x.shape[3] == head_dim, op, "%s head dim %d differs from the query's %d" % (what, x.shape[3], head_dim))
    return x.transpose(1, 2) if layout == "BSND" else x


def _from_bnsd(x, layout):
    b, n, s, d = x.shape
    if layout == "BSH":
        return x.transpose(1, 2).reshape(b, s, n * d)
    if layout == "SBH":
        return x.permute(2, 0, 1, 3).reshape(s, b, n * d)
    if layout == "BSND":
        return x.transpose(1, 2).contiguous()
    return x.contiguous()


@impl("npu_fusion_attention")
def npu_fusion_attention(query, key, value, head_num, input_layout, pse=None, padding_mask=None,
                         atten_mask=None, scale=1.0, keep_prob=1.0, pre_tockens=_MAX_TOKENS,
                         next_tockens=_MAX_TOKENS, inner_precise=0, prefix=None, actual_seq_qlen=None,
                         actual_seq_kvlen=None, sparse_mode=0, gen_mask_parallel=True, sync=False,
                         softmax_layout="", sink=None, dropout_mask=None, seed=0, offset=0):
    """Fused attention: ``x = Mask(scale * (pse + q @ k^T), atten_mask)``,
    ``y = Softmax(x)`` over the key axis, ``attention_out = y @ v``.

    ``input_layout`` BSH / SBH / BSND / BNSD (TND is not emulated); ``head_num`` = query
    heads N; key/value may have fewer heads (GQA, N divisible by them: query head i uses
    key/value head ``i // (N / N_kv)``). ``atten_mask`` (bool or 0/1; True = masked, those
    logits are set to the float32 minimum) broadcasts to [B, N, S1, S2]. ``sparse_mode`` 0
    uses ``atten_mask`` as given (a ``pre_tockens``/``next_tockens`` band, keeping
    ``-pre <= j - i <= next``, is supported when S1 == S2); 2 / 3 build the left-up /
    right-down causal mask internally (any ``atten_mask`` passed, by spec the compressed
    2048x2048 one, is ignored); other modes raise NotImplementedError. ``pse`` is an
    additive bias broadcastable to [B, N, S1, S2]. Only ``keep_prob == 1`` (no dropout) is
    emulated. Computed in float32 for float16/bfloat16. Returns ``(attention_out`` in the
    input layout and dtype, ``softmax_max`` and ``softmax_sum`` [B, N, S1, 8] float32 (row max
    of x, row sum of exp(x - max), repeated over the last dim), ``softmax_out`` (empty),
    ``seed``, ``offset``, ``numels = B*N*S1*S2)``.
    """
    op = "npu_fusion_attention"
    if input_layout == "TND":
        raise NotImplementedError("%s: input_layout TND (varlen with actual_seq_qlen/actual_seq_kvlen) "
                                  "is not emulated on the CPU-emulated NPU" % op)
    check(input_layout in _LAYOUTS, op, "input_layout must be one of BSH, SBH, BSND, BNSD, TND; got %r"
          % (input_layout,))
    if sparse_mode not in (0, 2, 3):
        raise NotImplementedError("%s: sparse_mode %d is not emulated on the CPU-emulated NPU "
                                  "(supported: 0, 2, 3)" % (op, sparse_mode))
    if keep_prob != 1.0:
        raise NotImplementedError("%s: dropout (keep_prob=%r < 1) is not emulated on the CPU-emulated NPU"
                                  % (op, keep_prob))
    for arg, val in (("prefix", prefix), ("actual_seq_qlen", actual_seq_qlen),
                     ("actual_seq_kvlen", actual_seq_kvlen), ("sink", sink), ("dropout_mask", dropout_mask)):
        if val is not None:
            raise NotImplementedError("%s: argument %s is not emulated on the CPU-emulated NPU" % (op, arg))
    check(head_num > 0, op, "head_num must be positive, got %d" % head_num)
    check(query.dtype == key.dtype == value.dtype, op, "query, key and value must have one dtype")

    if input_layout in ("BSH", "SBH"):
        check(query.dim() == 3, op, "query must be 3-D for layout %s" % input_layout)
        check(query.shape[2] % head_num == 0, op, "query hidden size %d is not divisible by head_num %d"
              % (query.shape[2], head_num))
        head_dim = query.shape[2] // head_num
    else:
        check(query.dim() == 4, op, "query must be 4-D for layout %s" % input_layout)
        head_dim = query.shape[3]
    q = _to_bnsd(op, query, input_layout, head_dim, "query")
    k = _to_bnsd(op, key, input_layout, head_dim, "key")
    v = _to_bnsd(op, value, input_layout, head_dim, "value")
    b, n, s1, _ = q.shape
    n_kv, s2 = k.shape[1], k.shape[2]
    check(n == head_num, op, "query has %d heads but head_num is %d" % (n, head_num))
    check(tuple(k.shape) == tuple(v.shape), op, "key %s and value %s shapes differ"
          % (tuple(key.shape), tuple(value.shape)))
    check(k.shape[0] == b, op, "key batch %d differs from the query's %d" % (k.shape[0], b))
    check(n_kv > 0 and n % n_kv == 0, op, "head_num %d is not divisible by the key/value heads %d" % (n, n_kv))
    g = n // n_kv

    qf, kf, vf = acc(q), acc(k), acc(v)
    # grouped heads: [B, Nkv, G, S1, D] @ [B, Nkv, 1, D, S2] -> no repeated key/value copies
    scores = torch.matmul(qf.reshape(b, n_kv, g, s1, head_dim), kf.unsqueeze(2).transpose(-1, -2))
    scores = scores.reshape(b, n, s1, s2)
    if pse is not None:
        scores = scores + acc(pse).to(scores.dtype)
    scores = scores * scale

    mask = None
    if sparse_mode == 0:
        if atten_mask is not None:
            mask = atten_mask if atten_mask.dtype == torch.bool else atten_mask != 0
        band = pre_tockens < s1 - 1 or next_tockens < s2 - 1
        if band:
            if s1 != s2:
                raise NotImplementedError("%s: sparse_mode 0 with a pre_tockens/next_tockens band and S1 != S2 "
                                          "is not emulated on the CPU-emulated NPU" % op)
            i = torch.arange(s1, device=scores.device).unsqueeze(1)
            j = torch.arange(s2, device=scores.device).unsqueeze(0)
            out_band = (j - i > next_tockens) | (i - j > pre_tockens)
            mask = out_band if mask is None else (mask | out_band)
    else:
        diag = 1 if sparse_mode == 2 else 1 + s2 - s1
        mask = torch.ones(s1, s2, dtype=torch.bool, device=scores.device).triu(diag)
    if mask is not None:
        scores = scores.masked_fill(mask, torch.finfo(torch.float32).min)

    row_max = scores.amax(-1, keepdim=True)
    exp = torch.exp(scores - row_max.detach())
    row_sum = exp.sum(-1, keepdim=True)
    probs = exp / row_sum
    out = torch.matmul(probs.reshape(b, n_kv, g, s1, s2), vf.unsqueeze(2)).reshape(b, n, s1, head_dim)
    out = _from_bnsd(out.to(query.dtype), input_layout)

    sdt = stat_dtype(query)
    softmax_max = row_max.detach().to(sdt).expand(b, n, s1, 8).contiguous()
    softmax_sum = row_sum.detach().to(sdt).expand(b, n, s1, 8).contiguous()
    softmax_out = query.new_empty([0])
    return out, softmax_max, softmax_sum, softmax_out, seed, offset, b * n * s1 * s2
