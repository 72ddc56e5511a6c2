"""Graph-mode (ACL graph) variants of emulated attention ops: npu_fusion_attention_v3 (+grad,
+.out), npu_fused_infer_attention_score.out and the ``_*_infer_output`` allocators.

* npu_fusion_attention_v3 is documented as "the version of npu_fusion_attention that supports
  graph mode": the same computation, with ``actual_seq_qlen`` / ``actual_seq_kvlen`` given as
  tensors of cumulative lengths, ``seed`` / ``offset`` returned as 1-element int64 tensors and
  no ``numels``. The emulator runs the emulated npu_fusion_attention. The cumulative lengths
  and seed/offset are read on the host (the emulated kernel needs them as ints), so TND
  layouts and dropout need real tensors (not FakeTensors).
* npu_fusion_attention_grad_v3 runs the emulated npu_fusion_attention_grad the same way.
* ``.out`` overloads compute the default overload and copy into the given outputs (resized
  as the results); the ``workspace`` argument is the hardware scratch buffer and is not used.
* ``_npu_fused_infer_attention_score[_v2]_infer_output`` / ``_npu_fusion_attention[_grad]_v3_infer_output``
  allocate (uninitialised, as on hardware) the outputs of the matching op, with the shapes
  and dtypes of its documented outputs, for the graph-capture handlers that then call ``.out``.
"""
import torch

from torch_npu.op_plugin._common import check, unsupported
from torch_npu.op_plugin._registry import impl

__all__ = []

_MAX = 2147483647


def _lengths(op, name, t):
    """Cumulative lengths tensor -> host ints (None stays None)."""
    if t is None:
        return None
    if not torch.is_tensor(t):
        return [int(v) for v in t]
    check(t.dim() == 1, op, "%s must be a 1-D tensor of cumulative lengths, got %d-D", (name, t.dim()))
    return [int(v) for v in t.tolist()]


def _host_int(op, name, t):
    if t is None:
        return 0
    if not torch.is_tensor(t):
        return int(t)
    check(t.numel() == 1, op, "%s must hold one value, got %d", (name, t.numel()))
    return int(t.reshape(-1)[0].item())


def _copy_out(dst, src):
    if tuple(dst.shape) != tuple(src.shape):
        dst.resize_(src.shape)
    return dst.copy_(src)


# ---------------------------------------------------------------- npu_fusion_attention_v3

def _fa_v3(query, key, value, head_num, input_layout, pse, padding_mask, atten_mask, scale, keep_prob,
           pre_tockens, next_tockens, inner_precise, prefix, actual_seq_qlen, actual_seq_kvlen, sparse_mode,
           gen_mask_parallel, sync, softmax_layout, sink):
    op = "npu_fusion_attention_v3"
    res = torch.ops.npu.npu_fusion_attention.default(
        query, key, value, head_num, input_layout, pse=pse, padding_mask=padding_mask, atten_mask=atten_mask,
        scale=scale, keep_prob=keep_prob, pre_tockens=pre_tockens, next_tockens=next_tockens,
        inner_precise=inner_precise, prefix=None if prefix is None else [int(p) for p in prefix],
        actual_seq_qlen=_lengths(op, "actual_seq_qlen", actual_seq_qlen),
        actual_seq_kvlen=_lengths(op, "actual_seq_kvlen", actual_seq_kvlen), sparse_mode=sparse_mode,
        gen_mask_parallel=gen_mask_parallel, sync=sync, softmax_layout=softmax_layout, sink=sink)
    out, smax, ssum, sout, seed, offset = res[0], res[1], res[2], res[3], res[4], res[5]
    seed_t = torch.tensor([int(seed)], dtype=torch.int64, device=query.device)
    offset_t = torch.tensor([int(offset)], dtype=torch.int64, device=query.device)
    return out, smax, ssum, sout, seed_t, offset_t


@impl("npu_fusion_attention_v3")
def npu_fusion_attention_v3(query, key, value, head_num, input_layout, pse=None, padding_mask=None,
                            atten_mask=None, scale=1., keep_prob=1., pre_tockens=_MAX, next_tockens=_MAX,
                            inner_precise=0, prefix=None, actual_seq_qlen=None, actual_seq_kvlen=None,
                            sparse_mode=0, gen_mask_parallel=True, sync=False, softmax_layout="", sink=None):
    """npu_fusion_attention with tensor cumulative lengths; returns (attention_score, softmax_max,
    softmax_sum, softmax_out, seed [1] int64, offset [1] int64). Differentiable (the backward is
    npu_fusion_attention's)."""
    return _fa_v3(query, key, value, head_num, input_layout, pse, padding_mask, atten_mask, scale, keep_prob,
                  pre_tockens, next_tockens, inner_precise, prefix, actual_seq_qlen, actual_seq_kvlen,
                  sparse_mode, gen_mask_parallel, sync, softmax_layout, sink)


@impl("npu_fusion_attention_v3.out")
def npu_fusion_attention_v3_out(query, key, value, head_num, input_layout, pse=None, padding_mask=None,
                                atten_mask=None, scale=1., keep_prob=1., pre_tockens=_MAX, next_tockens=_MAX,
                                inner_precise=0, prefix=None, actual_seq_qlen=None, actual_seq_kvlen=None,
                                sparse_mode=0, gen_mask_parallel=True, sync=False, softmax_layout="", sink=None,
                                workspace=None, *, attention_score, softmax_max, softmax_sum, softmax_out, seed,
                                offset):
    res = _fa_v3(query, key, value, head_num, input_layout, pse, padding_mask, atten_mask, scale, keep_prob,
                 pre_tockens, next_tockens, inner_precise, prefix, actual_seq_qlen, actual_seq_kvlen,
                 sparse_mode, gen_mask_parallel, sync, softmax_layout, sink)
    outs = (attention_score, softmax_max, softmax_sum, softmax_out, seed, offset)
    return tuple(_copy_out(dst, src) for dst, src in zip(outs, res))


def _fa_grad_v3(query, key, value, dy, head_num, input_layout, pse, padding_mask, atten_mask, softmax_max,
                softmax_sum, softmax_in, attention_in, scale_value, keep_prob, pre_tockens, next_tockens,
                inner_precise, seed, offset, prefix, actual_seq_qlen, actual_seq_kvlen, sparse_mode,
                gen_mask_parallel, sync, softmax_layout, sink):
    op = "npu_fusion_attention_grad_v3"
    return torch.ops.npu.npu_fusion_attention_grad.default(
        query, key, value, dy, head_num, input_layout, pse=pse, padding_mask=padding_mask, atten_mask=atten_mask,
        softmax_max=softmax_max, softmax_sum=softmax_sum, softmax_in=softmax_in, attention_in=attention_in,
        scale_value=scale_value, keep_prob=keep_prob, pre_tockens=pre_tockens, next_tockens=next_tockens,
        inner_precise=inner_precise, seed=_host_int(op, "seed", seed), offset=_host_int(op, "offset", offset),
        prefix=None if prefix is None else [int(p) for p in prefix],
        actual_seq_qlen=_lengths(op, "actual_seq_qlen", actual_seq_qlen),
        actual_seq_kvlen=_lengths(op, "actual_seq_kvlen", actual_seq_kvlen), sparse_mode=sparse_mode,
        gen_mask_parallel=gen_mask_parallel, sync=sync, softmax_layout=softmax_layout, sink=sink)


@impl("npu_fusion_attention_grad_v3")
def npu_fusion_attention_grad_v3(query, key, value, dy, head_num, input_layout, *, pse=None, padding_mask=None,
                                 atten_mask=None, softmax_max=None, softmax_sum=None, softmax_in=None,
                                 attention_in=None, scale_value=1., keep_prob=1., pre_tockens=_MAX,
                                 next_tockens=_MAX, inner_precise=0, seed=None, offset=None, prefix=None,
                                 actual_seq_qlen=None, actual_seq_kvlen=None, sparse_mode=0,
                                 gen_mask_parallel=True, sync=False, softmax_layout="", sink=None):
    """npu_fusion_attention_grad with tensor seed / offset / cumulative lengths:
    (dq, dk, dv, dpse, dsink)."""
    return _fa_grad_v3(query, key, value, dy, head_num, input_layout, pse, padding_mask, atten_mask, softmax_max,
                       softmax_sum, softmax_in, attention_in, scale_value, keep_prob, pre_tockens, next_tockens,
                       inner_precise, seed, offset, prefix, actual_seq_qlen, actual_seq_kvlen, sparse_mode,
                       gen_mask_parallel, sync, softmax_layout, sink)


@impl("npu_fusion_attention_grad_v3.out")
def npu_fusion_attention_grad_v3_out(query, key, value, dy, head_num, input_layout, *, pse=None, padding_mask=None,
                                     atten_mask=None, softmax_max=None, softmax_sum=None, softmax_in=None,
                                     attention_in=None, scale_value=1., keep_prob=1., pre_tockens=_MAX,
                                     next_tockens=_MAX, inner_precise=0, seed=None, offset=None, prefix=None,
                                     actual_seq_qlen=None, actual_seq_kvlen=None, sparse_mode=0,
                                     gen_mask_parallel=True, sync=False, softmax_layout="", sink=None,
                                     workspace=None, dq, dk, dv, dpse, dsink):
    res = _fa_grad_v3(query, key, value, dy, head_num, input_layout, pse, padding_mask, atten_mask, softmax_max,
                      softmax_sum, softmax_in, attention_in, scale_value, keep_prob, pre_tockens, next_tockens,
                      inner_precise, seed, offset, prefix, actual_seq_qlen, actual_seq_kvlen, sparse_mode,
                      gen_mask_parallel, sync, softmax_layout, sink)
    return tuple(_copy_out(dst, src) for dst, src in zip((dq, dk, dv, dpse, dsink), res))


def _fa_stat_shape(op, query, head_num, input_layout):
    layout = input_layout.upper()
    if layout == "TND":
        check(query.dim() == 3, op, "query must be 3-D for TND")
        return (query.shape[0], head_num, 8)
    dims = {"BSH": (0, 1, 3), "SBH": (1, 0, 3), "BSND": (0, 1, 4), "BNSD": (0, 2, 4)}
    check(layout in dims, op, "input_layout must be BSH, SBH, BSND, BNSD or TND, got %r", input_layout)
    b, s, rank = dims[layout]
    check(query.dim() == rank, op, "query must be %d-D for %s, got %d-D", (rank, layout, query.dim()))
    return (query.shape[b], head_num, query.shape[s], 8)


@impl("_npu_fusion_attention_v3_infer_output")
def _npu_fusion_attention_v3_infer_output(query, key, value, head_num, input_layout):
    """Allocates (attention_score like query, softmax_max, softmax_sum float32 [B, N, S1, 8] /
    [T, N, 8] for TND)."""
    shape = _fa_stat_shape("_npu_fusion_attention_v3_infer_output", query, head_num, input_layout)
    return (torch.empty_like(query), query.new_empty(shape, dtype=torch.float32),
            query.new_empty(shape, dtype=torch.float32))


@impl("_npu_fusion_attention_grad_v3_infer_output")
def _npu_fusion_attention_grad_v3_infer_output(query, key, value, pse=None, sink=None):
    """Allocates (dq like query, dk like key, dv like value, dpse like pse (else empty), dsink
    like sink (else empty))."""
    dpse = query.new_empty([0]) if pse is None else torch.empty_like(pse)
    dsink = query.new_empty([0]) if sink is None else torch.empty_like(sink)
    return torch.empty_like(query), torch.empty_like(key), torch.empty_like(value), dpse, dsink


# ---------------------------------------------------------------- npu_fused_infer_attention_score

@impl("npu_fused_infer_attention_score.out")
def npu_fused_infer_attention_score_out(query, key, value, *, pse_shift=None, atten_mask=None,
                                        actual_seq_lengths=None, actual_seq_lengths_kv=None, dequant_scale1=None,
                                        quant_scale1=None, dequant_scale2=None, quant_scale2=None,
                                        quant_offset2=None, antiquant_scale=None, antiquant_offset=None,
                                        key_antiquant_scale=None, key_antiquant_offset=None,
                                        value_antiquant_scale=None, value_antiquant_offset=None, block_table=None,
                                        query_padding_size=None, kv_padding_size=None, key_shared_prefix=None,
                                        value_shared_prefix=None, actual_shared_prefix_len=None, query_rope=None,
                                        key_rope=None, key_rope_antiquant_scale=None, num_heads=1, scale=1.0,
                                        pre_tokens=_MAX, next_tokens=_MAX, input_layout="BSH",
                                        num_key_value_heads=0, sparse_mode=0, inner_precise=0, block_size=0,
                                        antiquant_mode=0, key_antiquant_mode=0, value_antiquant_mode=0,
                                        softmax_lse_flag=False, workspace=None, attention_out, softmax_lse):
    """The emulated npu_fused_infer_attention_score, written into ``attention_out`` / ``softmax_lse``."""
    out, lse = torch.ops.npu.npu_fused_infer_attention_score.default(
        query, key, value, pse_shift=pse_shift, atten_mask=atten_mask, actual_seq_lengths=actual_seq_lengths,
        actual_seq_lengths_kv=actual_seq_lengths_kv, dequant_scale1=dequant_scale1, quant_scale1=quant_scale1,
        dequant_scale2=dequant_scale2, quant_scale2=quant_scale2, quant_offset2=quant_offset2,
        antiquant_scale=antiquant_scale, antiquant_offset=antiquant_offset, key_antiquant_scale=key_antiquant_scale,
        key_antiquant_offset=key_antiquant_offset, value_antiquant_scale=value_antiquant_scale,
        value_antiquant_offset=value_antiquant_offset, block_table=block_table,
        query_padding_size=query_padding_size, kv_padding_size=kv_padding_size,
        key_shared_prefix=key_shared_prefix, value_shared_prefix=value_shared_prefix,
        actual_shared_prefix_len=actual_shared_prefix_len, query_rope=query_rope, key_rope=key_rope,
        key_rope_antiquant_scale=key_rope_antiquant_scale, num_heads=num_heads, scale=scale,
        pre_tokens=pre_tokens, next_tokens=next_tokens, input_layout=input_layout,
        num_key_value_heads=num_key_value_heads, sparse_mode=sparse_mode, inner_precise=inner_precise,
        block_size=block_size, antiquant_mode=antiquant_mode, key_antiquant_mode=key_antiquant_mode,
        value_antiquant_mode=value_antiquant_mode, softmax_lse_flag=softmax_lse_flag)
    return _copy_out(attention_out, out), _copy_out(softmax_lse, lse)


# input_layout -> (query layout, attention_out layout)
_FIA_LAYOUTS = {
    "BSH": ("BSH", "BSH"), "BSND": ("BSND", "BSND"), "BNSD": ("BNSD", "BNSD"), "TND": ("TND", "TND"),
    "NTD": ("NTD", "NTD"), "NSD": ("NSD", "NSD"), "BNSD_BSND": ("BNSD", "BSND"), "BSH_BNSD": ("BSH", "BNSD"),
    "BSND_BNSD": ("BSND", "BNSD"), "NTD_TND": ("NTD", "TND"), "BSH_NBSD": ("BSH", "NBSD"),
    "BSND_NBSD": ("BSND", "NBSD"), "BNSD_NBSD": ("BNSD", "NBSD"), "TND_NTD": ("TND", "NTD"),
}
_QUERY_RANK = {"BSH": 3, "TND": 3, "NTD": 3, "NSD": 3, "BSND": 4, "BNSD": 4}


def fia_output_shapes(op, query, value, input_layout, block_table, num_heads, num_key_value_heads):
    """(attention_out shape, lse shape with the flag set) of the fused infer attention ops."""
    check(num_heads > 0, op, "num_heads must be > 0, got %d", num_heads)
    check(input_layout in _FIA_LAYOUTS, op, "input_layout %r is not supported", (input_layout,))
    q_layout, o_layout = _FIA_LAYOUTS[input_layout]
    check(query.dim() == _QUERY_RANK[q_layout], op, "query must be %d-D for layout %s, got %d-D", (_QUERY_RANK[q_layout], q_layout, query.dim()))
    n_kv = num_heads if num_key_value_heads == 0 else num_key_value_heads
    if block_table is not None:
        check(value.dim() in (3, 4, 5), op, "with block_table value must be 3-, 4- or 5-D, got %d-D", value.dim())
        dv = {3: lambda: value.shape[2] // n_kv, 4: lambda: value.shape[3],
              5: lambda: value.shape[2] * value.shape[4]}[value.dim()]()
    else:
        check(value.dim() == query.dim(), op, "value must have query's rank %d, got %d", (query.dim(), value.dim()))
        dv = value.shape[2] // n_kv if q_layout == "BSH" else value.shape[3] if q_layout in ("BSND", "BNSD") \
            else value.shape[2]
    if value.dtype == torch.int32:  # int4 packed in int32
        dv *= 8
    if q_layout in ("TND", "NTD"):
        t, n = (query.shape[0], query.shape[1]) if q_layout == "TND" else (query.shape[1], query.shape[0])
        out = {"TND": (t, n, dv), "NTD": (n, t, dv)}[o_layout]
        return out, (t, n, 1)
    if q_layout == "BSH":
        b, s, n = query.shape[0], query.shape[1], num_heads
    elif q_layout == "BSND":
        b, s, n = query.shape[0], query.shape[1], query.shape[2]
    elif q_layout == "BNSD":
        b, s, n = query.shape[0], query.shape[2], query.shape[1]
    else:  # NSD
        b, s, n = 1, query.shape[1], query.shape[0]
    out = {"BSH": (b, s, n * dv), "BSND": (b, s, n, dv), "BNSD": (b, n, s, dv), "NBSD": (n, b, s, dv),
           "NSD": (n, s, dv)}[o_layout]
    return out, (b, n, s, 1)


@impl("_npu_fused_infer_attention_score_infer_output")
def _npu_fused_infer_attention_score_infer_output(query, value, *, input_layout="BSH", quant_scale2=None,
                                                  block_table=None, num_heads=1, num_key_value_heads=0,
                                                  softmax_lse_flag=False, query_rope=None):
    """Allocates (attention_out, softmax_lse) as npu_fused_infer_attention_score returns them:
    attention_out int8 with quant_scale2, query_rope's dtype (else float16) for int8 queries, else
    query's dtype; softmax_lse float32 [B, N, S1, 1] ([T, N, 1] for TND/NTD) with the flag, else [0]."""
    op = "_npu_fused_infer_attention_score_infer_output"
    out_shape, lse_shape = fia_output_shapes(op, query, value, input_layout, block_table, num_heads,
                                             num_key_value_heads)
    if quant_scale2 is not None:
        dtype = torch.int8
    elif query.dtype == torch.int8:
        dtype = query_rope.dtype if query_rope is not None else torch.float16
    else:
        dtype = query.dtype
    lse = query.new_empty(lse_shape if softmax_lse_flag else (0,), dtype=torch.float32)
    return query.new_empty(out_shape, dtype=dtype), lse


def _no_dtype_codes(op, **codes):
    for name, value in codes.items():
        if value is not None:
            raise NotImplementedError(
                "%s: %s=%r is not emulated (torch_npu dtype codes such as hifloat8 / float4 are not modelled; "
                "pass None to use the tensors' own dtypes)" % (op, name, value))


def fia_v2_output_dtype(query, quant_scale_out, query_rope):
    """attention_out dtype of npu_fused_infer_attention_score_v2 without dtype codes: int8 with
    quant_scale_out; for int8 / float8_e4m3fn queries query_rope's dtype, else float16; else query's."""
    if quant_scale_out is not None:
        return torch.int8
    if query.dtype in (torch.int8, torch.float8_e4m3fn):
        return query_rope.dtype if query_rope is not None else torch.float16
    return query.dtype


@impl("_npu_fused_infer_attention_score_v2_infer_output")
def _npu_fused_infer_attention_score_v2_infer_output(query, value, *, query_dtype=None, value_dtype=None,
                                                     input_layout="BSH", quant_scale_out=None, block_table=None,
                                                     num_query_heads=1, num_key_value_heads=0,
                                                     return_softmax_lse=False, query_rope=None, out_dtype=None):
    """Allocates (attention_out, softmax_lse) as npu_fused_infer_attention_score_v2 returns them
    (shapes as npu_fused_infer_attention_score; dtype codes raise NotImplementedError)."""
    op = "_npu_fused_infer_attention_score_v2_infer_output"
    _no_dtype_codes(op, query_dtype=query_dtype, value_dtype=value_dtype, out_dtype=out_dtype)
    out_shape, lse_shape = fia_output_shapes(op, query, value, input_layout, block_table, num_query_heads,
                                             num_key_value_heads)
    lse = query.new_empty(lse_shape if return_softmax_lse else (0,), dtype=torch.float32)
    return query.new_empty(out_shape, dtype=fia_v2_output_dtype(query, quant_scale_out, query_rope)), lse


# ---------------------------------------------------------------- npu_fused_infer_attention_score_v2

_V2_QUANT_ARGS = ("dequant_scale_query", "dequant_scale_key", "dequant_offset_key", "dequant_scale_value",
                  "dequant_offset_value", "dequant_scale_key_rope", "quant_scale_out", "quant_offset_out",
                  "quant_scale_p", "learnable_sink")
_V2_DTYPE_ARGS = ("query_dtype", "key_dtype", "value_dtype", "query_rope_dtype", "key_rope_dtype",
                  "key_shared_prefix_dtype", "value_shared_prefix_dtype", "dequant_scale_query_dtype",
                  "dequant_scale_key_dtype", "dequant_scale_value_dtype", "dequant_scale_key_rope_dtype", "out_dtype")


def _fia_v2(args):
    """v2 is v1 with renamed arguments (num_query_heads = num_heads, softmax_scale = scale,
    actual_seq_qlen / _kvlen = actual_seq_lengths / _kv, return_softmax_lse = softmax_lse_flag);
    its (de)quantisation inputs, learnable_sink and dtype codes are not emulated."""
    op = "npu_fused_infer_attention_score_v2"
    for name in _V2_QUANT_ARGS:
        if args[name] is not None:
            unsupported(op, "argument %s" % name)
    _no_dtype_codes(op, **{name: args[name] for name in _V2_DTYPE_ARGS})
    for name in ("query_quant_mode", "key_quant_mode", "value_quant_mode"):
        if args[name] != 0:
            raise NotImplementedError("%s: %s=%r is not emulated" % (op, name, args[name]))
    return torch.ops.npu.npu_fused_infer_attention_score.default(
        args["query"], args["key"], args["value"], pse_shift=args["pse_shift"], atten_mask=args["atten_mask"],
        actual_seq_lengths=args["actual_seq_qlen"], actual_seq_lengths_kv=args["actual_seq_kvlen"],
        block_table=args["block_table"], query_rope=args["query_rope"], key_rope=args["key_rope"],
        num_heads=args["num_query_heads"], scale=args["softmax_scale"], pre_tokens=args["pre_tokens"],
        next_tokens=args["next_tokens"], input_layout=args["input_layout"],
        num_key_value_heads=args["num_key_value_heads"], sparse_mode=args["sparse_mode"],
        inner_precise=args["inner_precise"], block_size=args["block_size"],
        softmax_lse_flag=args["return_softmax_lse"])


@impl("npu_fused_infer_attention_score_v2")
def npu_fused_infer_attention_score_v2(query, key, value, *, query_rope=None, key_rope=None, pse_shift=None,
                                       atten_mask=None, actual_seq_qlen=None, actual_seq_kvlen=None, block_table=None,
                                       dequant_scale_query=None, dequant_scale_key=None, dequant_offset_key=None,
                                       dequant_scale_value=None, dequant_offset_value=None,
                                       dequant_scale_key_rope=None, quant_scale_out=None, quant_offset_out=None,
                                       quant_scale_p=None, learnable_sink=None, num_query_heads=1,
                                       num_key_value_heads=0, softmax_scale=1.0, pre_tokens=_MAX, next_tokens=_MAX,
                                       input_layout="BSH", sparse_mode=0, block_size=0, query_quant_mode=0,
                                       key_quant_mode=0, value_quant_mode=0, inner_precise=0,
                                       return_softmax_lse=False, query_dtype=None, key_dtype=None, value_dtype=None,
                                       query_rope_dtype=None, key_rope_dtype=None, key_shared_prefix_dtype=None,
                                       value_shared_prefix_dtype=None, dequant_scale_query_dtype=None,
                                       dequant_scale_key_dtype=None, dequant_scale_value_dtype=None,
                                       dequant_scale_key_rope_dtype=None, out_dtype=None):
    """The emulated npu_fused_infer_attention_score under v2's argument names (see _fia_v2):
    (attention_out, softmax_lse)."""
    return _fia_v2(locals())


@impl("npu_fused_infer_attention_score_v2.out")
def npu_fused_infer_attention_score_v2_out(query, key, value, *, query_rope=None, key_rope=None, pse_shift=None,
                                           atten_mask=None, actual_seq_qlen=None, actual_seq_kvlen=None,
                                           block_table=None, dequant_scale_query=None, dequant_scale_key=None,
                                           dequant_offset_key=None, dequant_scale_value=None,
                                           dequant_offset_value=None, dequant_scale_key_rope=None,
                                           quant_scale_out=None, quant_offset_out=None, quant_scale_p=None,
                                           learnable_sink=None, num_query_heads=1, num_key_value_heads=0,
                                           softmax_scale=1.0, pre_tokens=_MAX, next_tokens=_MAX, input_layout="BSH",
                                           sparse_mode=0, block_size=0, query_quant_mode=0, key_quant_mode=0,
                                           value_quant_mode=0, inner_precise=0, return_softmax_lse=False,
                                           query_dtype=None, key_dtype=None, value_dtype=None, query_rope_dtype=None,
                                           key_rope_dtype=None, key_shared_prefix_dtype=None,
                                           value_shared_prefix_dtype=None, dequant_scale_query_dtype=None,
                                           dequant_scale_key_dtype=None, dequant_scale_value_dtype=None,
                                           dequant_scale_key_rope_dtype=None, out_dtype=None, workspace=None,
                                           attention_out, softmax_lse):
    out, lse = _fia_v2(locals())
    return _copy_out(attention_out, out), _copy_out(softmax_lse, lse)
