"""Training attention ops: npu_fusion_attention (FlashAttentionScore) and its explicit
backward npu_fusion_attention_grad, and the _v2 pair.

``y = Softmax(Mask(scale * (pse + q @ k^T), atten_mask))``, ``attention_out =
Dropout(y, keep_prob) @ v`` (v2 with ``pse_type=0``: ``scale * q @ k^T + pse``), on the
chunked engine of ``attention.flash`` (at most one block of logits alive, as a flash
kernel), with the layouts of ``attention.layout`` (BSH, SBH, BSND, BNSD, TND varlen), the
sparse modes of ``attention.masks`` (0-8) and the (seed, offset) dropout of
``attention.dropout_mask``. Autograd runs through an ``autograd.Function`` whose backward is the
same code as npu_fusion_attention_grad (recomputation from the saved output and
log-sum-exp, the dropout mask regenerated from seed/offset).
"""
import torch
from torch.autograd.function import once_differentiable

import torch_npu

from torch_npu.op_plugin._common import acc, check, reject_given, unsupported
from torch_npu.op_plugin._registry import impl
from torch_npu.op_plugin.attention import flash as flash
from torch_npu.op_plugin.attention.dropout_mask import draw_seed_offset
from torch_npu.op_plugin.attention.layout import Plan

__all__ = []

_MAX_TOKENS = 2147483647


def _check_keep_prob(op, keep_prob):
    check(0 < keep_prob <= 1, op, "The keep_prob value must be in range of (0, 1], but got %s", keep_prob)


class _Config:
    """Everything but the differentiable tensors: the plan, scale, pse placement, dropout."""

    def __init__(self, plan, scale, pse_type, keep_prob, seed, offset, dtype):
        self.plan, self.scale, self.pse_type, self.dtype = plan, scale, pse_type, dtype
        self.dropout = flash.Dropout(keep_prob, seed, offset) if keep_prob < 1 else None


def _forward(cfg, query, key, value, pse):
    segs = cfg.plan.segments(query, key, value, pse)
    results = [flash.forward(s, cfg.scale, cfg.pse_type, cfg.dropout, cfg.dtype) for s in segs]
    return segs, results


def _backward(cfg, segs, outs, lses, dy, query, key, value, pse, want_dpse):
    plan = cfg.plan
    douts = plan.split_q(dy)
    grads = [flash.backward(s, cfg.scale, cfg.pse_type, cfg.dropout, cfg.dtype, acc(o).to(cfg.dtype), lse,
                            acc(g).to(cfg.dtype), want_dpse)
             for s, o, lse, g in zip(segs, outs, lses, douts)]
    dq = plan.merge_q([g[0] for g in grads], query).to(query.dtype)
    dk = plan.merge_kv([g[1] for g in grads], key).to(key.dtype)
    dv = plan.merge_kv([g[2] for g in grads], value).to(value.dtype)
    dpse = None
    if want_dpse and pse is not None:
        dpse = grads[0][3].reshape(pse.shape).to(pse.dtype)
    return dq, dk, dv, dpse


class _FusionAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, query, key, value, pse, cfg):
        segs, results = _forward(cfg, query, key, value, pse)
        plan = cfg.plan
        out = plan.merge_q([r[0] for r in results], query).to(query.dtype)
        smax = plan.merge_stats([r[1] for r in results], query)
        ssum = plan.merge_stats([r[2] for r in results], query)
        ctx.cfg = cfg
        ctx.lses = [r[3] for r in results]
        ctx.save_for_backward(query, key, value, pse, out)
        ctx.mark_non_differentiable(smax, ssum)
        return out, smax, ssum

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, _dmax, _dsum):
        query, key, value, pse, out = ctx.saved_tensors
        cfg = ctx.cfg
        segs = cfg.plan.segments(query, key, value, pse)
        outs = cfg.plan.split_q(out)
        want_dpse = pse is not None and ctx.needs_input_grad[3]
        dq, dk, dv, dpse = _backward(cfg, segs, outs, ctx.lses, dy, query, key, value, pse, want_dpse)
        return dq, dk, dv, dpse, None


def _one_block_attention(plan, query, key, value, scale, dropout):
    """The forward of a call that needs neither the autograd.Function nor the segment engine,
    differentiated by autograd through plain ATen ops, or None when it needs them (TND, pse
    (checked by the caller), a mask SDPA cannot express, dropout over more than one small
    block). Without dropout: ATen's CPU flash kernel (attention.flash.sdpa_attention); with
    it: the engine's formula in one block (attention.flash.small_dropout_attention). Per call
    this is a few ATen ops, so the fused op costs about what SDPA costs."""
    if plan.layout == "TND":
        return None
    if dropout is not None:
        b, n, s1, s2 = plan.b, plan.head_num, plan.s1, plan.s2
        if b * n * s1 * s2 > flash.SMALL_ELEMENTS or flash._rows_per_block(b, n, s1, s2) < s1:
            return None
    seg = plan.segments(query, key, value, None)[0]
    causal = flash._sdpa_causal(seg, None, scale)
    if causal is None:
        return None
    dtype = acc(query).dtype
    if dropout is None:
        out, row_max, row_sum, _ = flash.sdpa_attention(seg, scale, causal, dtype)
    else:
        out, row_max, row_sum = flash.small_dropout_attention(seg, scale, dropout, dtype)
    return (plan.merge_q([out], query).to(query.dtype), plan.merge_stats([row_max], query),
            plan.merge_stats([row_sum], query))


def _attention(op, query, key, value, head_num, input_layout, pse, atten_mask, scale, keep_prob, pre_tokens,
               next_tokens, prefix, actual_seq_qlen, actual_seq_kvlen, sparse_mode, pse_type):
    _check_keep_prob(op, keep_prob)
    plan = Plan(op, query, key, value, head_num, input_layout, pse, atten_mask, pre_tokens, next_tokens, prefix,
                actual_seq_qlen, actual_seq_kvlen, sparse_mode)
    seed, offset = draw_seed_offset(query) if keep_prob < 1 else (0, 0)
    cfg = _Config(plan, scale, pse_type, keep_prob, seed, offset, acc(query).dtype)
    if pse is None:
        fast = _one_block_attention(plan, query, key, value, scale, cfg.dropout)
        if fast is not None:
            out, smax, ssum = fast
            return out, smax, ssum, query.new_empty([0]), seed, offset, plan.numels
    out, smax, ssum = _FusionAttention.apply(query, key, value, pse, cfg)
    return out, smax, ssum, query.new_empty([0]), seed, offset, plan.numels


def _attention_grad(op, query, key, value, dy, head_num, input_layout, pse, atten_mask, scale_value, keep_prob,
                    pre_tokens, next_tokens, seed, offset, prefix, actual_seq_qlen, actual_seq_kvlen, sparse_mode,
                    pse_type):
    _check_keep_prob(op, keep_prob)
    check(tuple(dy.shape) == tuple(query.shape), op, "dy shape %s differs from the query's %s", (tuple(dy.shape), tuple(query.shape)))
    plan = Plan(op, query, key, value, head_num, input_layout, pse, atten_mask, pre_tokens, next_tokens, prefix,
                actual_seq_qlen, actual_seq_kvlen, sparse_mode)
    cfg = _Config(plan, scale_value, pse_type, keep_prob, seed, offset, acc(query).dtype)
    with torch.no_grad():
        segs, results = _forward(cfg, query, key, value, pse)
        dq, dk, dv, dpse = _backward(cfg, segs, [r[0] for r in results], [r[3] for r in results], dy, query, key,
                                     value, pse, True)
    return dq, dk, dv, (dpse if dpse is not None else query.new_empty([0]))


@impl("npu_fusion_attention")
def npu_fusion_attention(query, key, value, head_num, input_layout, pse=None, padding_mask=None,
                         atten_mask=None, scale=1.0, keep_prob=1.0, pre_tockens=_MAX_TOKENS,
                         next_tockens=_MAX_TOKENS, inner_precise=0, prefix=None, actual_seq_qlen=None,
                         actual_seq_kvlen=None, sparse_mode=0, gen_mask_parallel=True, sync=False,
                         softmax_layout="", sink=None, dropout_mask=None, seed=0, offset=0):
    """Fused attention ``Dropout(Softmax(Mask(scale * (pse + q @ k^T), atten_mask)), keep_prob) @ v``.

    ``input_layout`` BSH / SBH / BSND / BNSD / TND (case-insensitive; TND = varlen packing
    with cumulative ``actual_seq_qlen`` / ``actual_seq_kvlen``); ``head_num`` = query heads N,
    key/value may have fewer (GQA). ``atten_mask`` bool or 0/1, True = masked, BNSS / B1SS /
    11SS / SS ([maxSq, maxSkv] for TND); without it every sparse_mode, pre/next are ignored
    (full computation). ``sparse_mode`` 0-6 (7/8 TND only), see attention.masks; ``prefix``
    for 5/6. ``pse`` BNSS / BN1S / 1NSS. ``keep_prob`` in (0, 1]: dropout drawn from the npu
    generator (``torch.npu.manual_seed`` reproduces it); the returned ``seed`` / ``offset``
    regenerate it in npu_fusion_attention_grad. Returns ``(attention_out`` in the input
    layout and dtype, ``softmax_max``, ``softmax_sum`` float32 [B, N, S1, 8] ([T, N, 8] for
    TND), ``softmax_out`` (empty), ``seed``, ``offset``, ``numels`` = B*N*S1*S2 (TND:
    N * sum(Sq_b * Skv_b))``). Not emulated (NotImplementedError): padding_mask, sink,
    dropout_mask, the compressed alibi pse and pse with TND. The ``seed``/``offset`` inputs
    are not read (the pair comes from the generator)."""
    op = "npu_fusion_attention"
    if (pse is None and 0 < keep_prob <= 1 and prefix is None and actual_seq_qlen is None
            and actual_seq_kvlen is None and padding_mask is None and sink is None and dropout_mask is None
            and _plain(query, key, value, atten_mask)):
        # the common cases (no pse, no mask or a causal one; no dropout, or dropout on a small
        # call) in C++ (aten/FusionAttentionSdpa.cpp): the same ATen ops as the Python fast
        # paths (_one_block_attention), without their per-op Python cost. Anything else, and
        # every argument error, is the Python engine's. (The op's C++ kernel at the Autograd
        # keys takes such calls before this kernel runs: all of them without dropout, and
        # those on npu tensors with dropout, whose seed/offset it draws itself. They reach
        # here under inference mode, and with dropout on CPU tensors or under a TorchDispatchMode.)
        C = torch_npu._C
        if keep_prob == 1:
            fast = C._npu_fusion_attention_sdpa(query, key, value, head_num, input_layout, atten_mask, scale,
                                                sparse_mode, flash.CHUNK_ELEMENTS)
            if fast is not None:
                out, smax, ssum, softmax_out, numels = fast
                return out, smax, ssum, softmax_out, 0, 0, numels
        elif C._npu_fusion_attention_small_dropout_applies(query, key, value, head_num, input_layout, atten_mask,
                                                           scale, sparse_mode, flash.CHUNK_ELEMENTS,
                                                           flash.SMALL_ELEMENTS):
            seed, offset = draw_seed_offset(query)
            out, smax, ssum, softmax_out, numels = C._npu_fusion_attention_small_dropout(
                query, key, value, head_num, input_layout, atten_mask, scale, sparse_mode, keep_prob, seed, offset)
            return out, smax, ssum, softmax_out, seed, offset, numels
    reject_given(op, padding_mask=padding_mask, sink=sink, dropout_mask=dropout_mask)
    return _attention(op, query, key, value, head_num, input_layout, pse, atten_mask, scale, keep_prob,
                      pre_tockens, next_tockens, prefix, actual_seq_qlen, actual_seq_kvlen, sparse_mode, 1)


def _plain(*tensors):
    """Plain eager tensors (or None): no FakeTensor / FunctionalTensor of a compile trace,
    whose symbolic sizes the C++ path cannot read."""
    return all(t is None or type(t) is torch.Tensor for t in tensors)


@impl("npu_fusion_attention_grad")
def npu_fusion_attention_grad(query, key, value, dy, head_num, input_layout, pse=None, padding_mask=None,
                              atten_mask=None, softmax_max=None, softmax_sum=None, softmax_in=None,
                              attention_in=None, scale_value=1.0, keep_prob=1.0, pre_tockens=_MAX_TOKENS,
                              next_tockens=_MAX_TOKENS, inner_precise=0, seed=0, offset=0, numels=0,
                              prefix=None, actual_seq_qlen=None, actual_seq_kvlen=None, sparse_mode=0,
                              gen_mask_parallel=True, sync=False, softmax_layout="", sink=None):
    """Explicit backward of npu_fusion_attention: ``(dq, dk, dv, dpse, dsink)`` for the
    upstream gradient ``dy`` (query layout). The forward's probabilities are recomputed
    (softmax_max / softmax_sum / attention_in are not needed); with ``keep_prob < 1`` the
    dropout mask is regenerated from ``seed`` / ``offset`` as returned by the forward.
    ``dpse`` has pse's shape and dtype (empty when pse is None); ``dsink`` is empty."""
    op = "npu_fusion_attention_grad"
    reject_given(op, padding_mask=padding_mask, sink=sink)
    dq, dk, dv, dpse = _attention_grad(op, query, key, value, dy, head_num, input_layout, pse, atten_mask,
                                       scale_value, keep_prob, pre_tockens, next_tockens, seed, offset, prefix,
                                       actual_seq_qlen, actual_seq_kvlen, sparse_mode, 1)
    return dq, dk, dv, dpse, query.new_empty([0])


def _check_pse_type(op, pse_type, query_rope, key_rope):
    if pse_type in (2, 3):
        unsupported(op, "pse_type %d (alibi generated from slopes)" % pse_type)
    check(pse_type in (0, 1), op, "pse_type must be in 0-3, got %d", pse_type)
    reject_given(op, query_rope=query_rope, key_rope=key_rope)


@impl("npu_fusion_attention_v2")
def npu_fusion_attention_v2(query, key, value, head_num, input_layout, pse=None, padding_mask=None,
                            atten_mask=None, query_rope=None, key_rope=None, scale=1.0, keep_prob=1.0,
                            pre_tokens=_MAX_TOKENS, next_tokens=_MAX_TOKENS, inner_precise=0, prefix=None,
                            actual_seq_qlen=None, actual_seq_kvlen=None, sparse_mode=0, gen_mask_parallel=True,
                            sync=False, pse_type=1, q_start_idx=None, kv_start_idx=None, softmax_layout="",
                            sink=None, dropout_mask=None, seed=0, offset=0):
    """npu_fusion_attention with ``pse_type``: 1 = ``scale * (q @ k^T + pse)`` (as v1), 0 =
    ``scale * q @ k^T + pse``. pse_type 2/3 (alibi generated from slopes), query_rope /
    key_rope, sink, dropout_mask and padding_mask raise NotImplementedError; q_start_idx /
    kv_start_idx only offset the generated alibi (documented as unused otherwise). Same
    outputs as npu_fusion_attention."""
    op = "npu_fusion_attention_v2"
    _check_pse_type(op, pse_type, query_rope, key_rope)
    reject_given(op, padding_mask=padding_mask, sink=sink, dropout_mask=dropout_mask)
    return _attention(op, query, key, value, head_num, input_layout, pse, atten_mask, scale, keep_prob,
                      pre_tokens, next_tokens, prefix, actual_seq_qlen, actual_seq_kvlen, sparse_mode, pse_type)


@impl("npu_fusion_attention_grad_v2")
def npu_fusion_attention_grad_v2(query, key, value, dy, head_num, input_layout, pse=None, padding_mask=None,
                                 atten_mask=None, softmax_max=None, softmax_sum=None, softmax_in=None,
                                 attention_in=None, query_rope=None, key_rope=None, scale_value=1.0,
                                 keep_prob=1.0, pre_tokens=_MAX_TOKENS, next_tokens=_MAX_TOKENS, inner_precise=0,
                                 seed=0, offset=0, numels=0, prefix=None, actual_seq_qlen=None,
                                 actual_seq_kvlen=None, sparse_mode=0, gen_mask_parallel=True, sync=False,
                                 pse_type=1, q_start_idx=None, kv_start_idx=None, softmax_layout="", sink=None):
    """Backward of npu_fusion_attention_v2: ``(dq, dk, dv, dpse`` (empty without pse), then
    three empty tensors for the not-emulated query_rope / key_rope / sink gradients``)``."""
    op = "npu_fusion_attention_grad_v2"
    _check_pse_type(op, pse_type, query_rope, key_rope)
    reject_given(op, padding_mask=padding_mask, sink=sink)
    dq, dk, dv, dpse = _attention_grad(op, query, key, value, dy, head_num, input_layout, pse, atten_mask,
                                       scale_value, keep_prob, pre_tokens, next_tokens, seed, offset, prefix,
                                       actual_seq_qlen, actual_seq_kvlen, sparse_mode, pse_type)
    empty = query.new_empty([0])
    return dq, dk, dv, dpse, empty, empty.clone(), empty.clone()
