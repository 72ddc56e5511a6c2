"""Workspace allocators of the graph-capture flows: ``_npu_fused_infer_attention_score_get_max_workspace``,
its ``_v2`` form, ``_npu_fusion_attention_v3_get_max_workspace`` and
``_npu_fusion_attention_grad_v3_get_max_workspace``.

On hardware these ask the aclnn kernel for the largest scratch buffer it may need
(``<kernel>GetMaxWorkspaceSize``, CANN's tiling) and allocate it, so that the ``.out`` overload
can run inside a captured graph with a fixed buffer instead of allocating one per call. Callers
(torch_npu's FA v3 graph handlers, torchair's static-workspace replacement, vLLM-Ascend /
LightLLM decode graphs) only keep the tensor and pass it as ``workspace=`` to
``npu_fused_infer_attention_score(_v2).out`` / ``npu_fusion_attention(_grad)_v3.out``.

Returned tensor: 1-D, on query's device, in query's dtype (op-plugin allocates
``{workspace_size}`` elements with ``query.options()`` for both FIA allocators; the FA v3
allocators' source is not in the reference material, the same convention is used). Its size
is the emulator's: the emulated ``.out`` kernels need no scratch memory and ignore
``workspace``, so the size is 0 elements (a legal ``GetWorkspaceSize`` result); it is not
CANN's tiling figure. The documented argument checks the real op runs first (the output shape
inference: layout and ranks) are run here too, so bad arguments fail at the same call.
"""
import torch

from torch_npu.op_plugin._common import check
from torch_npu.op_plugin._registry import impl
from torch_npu.op_plugin.attention.graph_variants import _fa_stat_shape, fia_output_shapes

__all__ = []

_MAX = 2147483647
# The emulated kernels use no scratch memory (see the module docstring).
EMULATED_WORKSPACE_ELEMENTS = 0


def _workspace(query):
    return query.new_empty((EMULATED_WORKSPACE_ELEMENTS,))


@impl("_npu_fused_infer_attention_score_get_max_workspace")
def _npu_fused_infer_attention_score_get_max_workspace(
        query, key, value, *, pse_shift=None, atten_mask=None, actual_seq_lengths=None,
        actual_seq_lengths_kv=None, dequant_scale1=None, quant_scale1=None, dequant_scale2=None, quant_scale2=None,
        quant_offset2=None, antiquant_scale=None, antiquant_offset=None, key_antiquant_scale=None,
        key_antiquant_offset=None, value_antiquant_scale=None, value_antiquant_offset=None, block_table=None,
        query_padding_size=None, kv_padding_size=None, key_shared_prefix=None, value_shared_prefix=None,
        actual_shared_prefix_len=None, query_rope=None, key_rope=None, key_rope_antiquant_scale=None, num_heads=1,
        scale=1.0, pre_tokens=_MAX, next_tokens=_MAX, input_layout="BSH", num_key_value_heads=0, sparse_mode=0,
        inner_precise=0, block_size=0, antiquant_mode=0, key_antiquant_mode=0, value_antiquant_mode=0,
        softmax_lse_flag=False):
    """Workspace for ``npu_fused_infer_attention_score.out``: 1-D, query's dtype and device, 0 elements
    (the emulated kernel needs none)."""
    fia_output_shapes("_npu_fused_infer_attention_score_get_max_workspace", query, value, input_layout,
                      block_table, num_heads, num_key_value_heads)
    return _workspace(query)


@impl("_npu_fused_infer_attention_score_v2_get_max_workspace")
def _npu_fused_infer_attention_score_v2_get_max_workspace(
        query, key, value, *, query_rope=None, key_rope=None, pse_shift=None, atten_mask=None, actual_seq_qlen=None,
        actual_seq_kvlen=None, block_table=None, dequant_scale_query=None, dequant_scale_key=None,
        dequant_offset_key=None, dequant_scale_value=None, dequant_offset_value=None, dequant_scale_key_rope=None,
        quant_scale_out=None, quant_offset_out=None, quant_scale_p=None, learnable_sink=None, num_query_heads=1,
        num_key_value_heads=0, softmax_scale=1.0, pre_tokens=_MAX, next_tokens=_MAX, input_layout="BSH",
        sparse_mode=0, block_size=0, query_quant_mode=0, key_quant_mode=0, value_quant_mode=0, inner_precise=0,
        return_softmax_lse=False, query_dtype=None, key_dtype=None, value_dtype=None, query_rope_dtype=None,
        key_rope_dtype=None, key_shared_prefix_dtype=None, value_shared_prefix_dtype=None,
        dequant_scale_query_dtype=None, dequant_scale_key_dtype=None, dequant_scale_value_dtype=None,
        dequant_scale_key_rope_dtype=None, out_dtype=None):
    """Workspace for ``npu_fused_infer_attention_score_v2.out``: 1-D, query's (tensor) dtype and device,
    0 elements. The torch_npu dtype codes only relabel tensors for the kernel; the allocation uses
    query's own dtype."""
    fia_output_shapes("_npu_fused_infer_attention_score_v2_get_max_workspace", query, value, input_layout,
                      block_table, num_query_heads, num_key_value_heads)
    return _workspace(query)


def _fa_v3_checks(op, query, key, value, head_num, input_layout, keep_prob):
    check(head_num > 0, op, "head_num must > 0, but got %d", head_num)
    for name, t in (("query", query), ("key", key), ("value", value)):
        check(t.dim() in (3, 4), op, "The shapes of the input %s should be 3 or 4 dimensional, but got %d-dimensional",
              (name, t.dim()))
    check(0 < keep_prob <= 1, op, "The keep_prob value must be in range of (0, 1], but got %r", (keep_prob,))
    _fa_stat_shape(op, query, head_num, input_layout)


@impl("_npu_fusion_attention_v3_get_max_workspace")
def _npu_fusion_attention_v3_get_max_workspace(query, key, value, head_num, input_layout, pse=None,
                                               padding_mask=None, atten_mask=None, scale=1., keep_prob=1.,
                                               pre_tockens=_MAX, next_tockens=_MAX, inner_precise=0, prefix=None,
                                               actual_seq_qlen=None, actual_seq_kvlen=None, sparse_mode=0,
                                               gen_mask_parallel=True, sync=False, softmax_layout="", sink=None):
    """Workspace for ``npu_fusion_attention_v3.out``: 1-D, query's dtype and device, 0 elements."""
    _fa_v3_checks("_npu_fusion_attention_v3_get_max_workspace", query, key, value, head_num, input_layout, keep_prob)
    return _workspace(query)


@impl("_npu_fusion_attention_grad_v3_get_max_workspace")
def _npu_fusion_attention_grad_v3_get_max_workspace(query, key, value, dy, head_num, input_layout, *, pse=None,
                                                    padding_mask=None, atten_mask=None, softmax_max=None,
                                                    softmax_sum=None, softmax_in=None, attention_in=None,
                                                    scale_value=1., keep_prob=1., pre_tockens=_MAX,
                                                    next_tockens=_MAX, inner_precise=0, seed=None, offset=None,
                                                    prefix=None, actual_seq_qlen=None, actual_seq_kvlen=None,
                                                    sparse_mode=0, gen_mask_parallel=True, sync=False,
                                                    softmax_layout="", sink=None):
    """Workspace for ``npu_fusion_attention_grad_v3.out``: 1-D, query's dtype and device, 0 elements."""
    op = "_npu_fusion_attention_grad_v3_get_max_workspace"
    _fa_v3_checks(op, query, key, value, head_num, input_layout, keep_prob)
    check(dy.dim() == query.dim(), op, "dy must have query's rank %d, got %d", (query.dim(), dy.dim()))
    return _workspace(query)
