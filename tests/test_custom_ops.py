"""The torch.ops.npu custom-op library (torch_npu/op_plugin).

Registry: all torch_npu 2.13.0 custom-op schemas are defined, exported as
``torch_npu.<name>``, ``torch_npu.__all__`` is the real list, legacy ``torch.<name>``
raises the real deprecation error, and ops that are not emulated raise
NotImplementedError naming themselves.

Emulated ops: each is checked against an independent float64 reference written
here from the documented formula (never by calling the implementation), forward
and backward (autograd of the op vs autograd of the reference), on CPU and npu
inputs, in float32/float16/bfloat16, plus Meta shape inference and float64
gradcheck for a few.
"""
import math
import re

import numpy as np
import pytest
import torch

import torch_npu
from torch_npu.utils._error_code import ErrCode, pta_error

from _op_helpers import DEVICES, close_to as assert_match, uniform as rand

# ---------------------------------------------------------------- reference data
# torch_npu 2.13.0: the 398 custom-op base names (custom_op_names.txt), the 119 public
# ones (public_npu_functions.txt) and the static part of torch_npu.__all__
# (module_all_lists.json), copied here so the tests do not depend on ../shared.
CUSTOM_OP_NAMES = """
_amp_foreach_non_finite_check _conv_depthwise2d_backward _dropout_with_byte_mask
_dropout_with_byte_mask_backward _gru_npu _gru_npu_backward _lstm_npu _lstm_npu_backward _npu_ciou
_npu_distribute_barrier _npu_dropout _npu_dropout_gen_mask _npu_dtype_cast _npu_dtype_cast_backward
_npu_format_cast _npu_fused_infer_attention_score_get_max_workspace
_npu_fused_infer_attention_score_infer_output _npu_fused_infer_attention_score_v2_get_max_workspace
_npu_fused_infer_attention_score_v2_infer_output _npu_fusion_attention_grad_v3_get_max_workspace
_npu_fusion_attention_grad_v3_infer_output _npu_fusion_attention_v3_get_max_workspace
_npu_fusion_attention_v3_infer_output _npu_index_add _npu_index_add_ _npu_matmul_abft_verify
_npu_moe_token_unpermute _npu_moe_token_unpermute_with_routing_map _npu_rms_norm_backward_quant
_npu_silent_check _npu_silent_check_v2 _npu_silent_check_v3
_npu_swiglu_backward_mx_quant_with_dual_axis _quantize_per_channel_impl _quantize_per_tensor_impl
attention_worker_scheduler attention_worker_scheduler_ batch_norm_gather_stats_update
batch_norm_reduce copy_memory_ dropout_with_byte_mask empty_with_format empty_with_swapped_memory
fast_gelu ffn_worker_scheduler ffn_worker_scheduler_ fft_c2r_backward fft_r2c_backward
get_npu_format get_storage_size kl_div_backward kl_div_target_backward l1_loss_backward
matmul_double_backward npu_add_layer_norm npu_add_layer_norm_backward npu_add_quant_gmm
npu_add_quant_gmm_ npu_add_quant_matmul npu_add_quant_matmul_ npu_add_rms_norm npu_add_rms_norm_cast
npu_add_rms_norm_dynamic_mx_quant npu_add_rms_norm_dynamic_quant npu_add_rms_norm_quant
npu_add_rms_norm_v2 npu_add_rms_norm_v2_functional npu_advance_step_flashattn npu_all_gather_base_mm
npu_all_gather_quant_mm npu_all_to_all_matmul npu_all_to_all_quant_matmul npu_alloc_float_status
npu_alltoallv_gmm npu_alltoallv_quant_gmm npu_anchor_response_flags npu_anti_mx_quant npu_anti_quant
npu_apply_adam npu_apply_adam_w npu_apply_rotary_pos_emb npu_attention_to_ffn npu_attention_update
npu_attention_worker_combine npu_attn_softmax_ npu_attn_softmax_backward_ npu_batch_gather_matmul
npu_batch_gather_matmul_ npu_batch_nms npu_bert_apply_adam
npu_binary_cross_entropy_with_logits_backward npu_block_sparse_attention
npu_block_sparse_attention_backward npu_bmmV2 npu_bmm_v2_mat1_backward npu_bmm_v2_mat2_backward
npu_bounding_box_decode npu_bounding_box_encode npu_broadcast npu_change_data_ptr
npu_chunk_gated_delta_rule npu_ciou npu_ciou_backward npu_clear_float_status npu_clipped_swiglu
npu_confusion_transpose npu_confusion_transpose_backward npu_conv2d npu_conv2d_backward npu_conv3d
npu_conv3d_backward npu_conv_transpose2d npu_conv_transpose2d_backward npu_conv_transpose3d_backward
npu_convert_weight_to_int4pack npu_convolution npu_convolution_backward npu_convolution_transpose
npu_convolution_transpose_backward npu_cross_entropy_loss npu_cross_entropy_loss_backward
npu_deep_norm npu_deep_norm_backward npu_deformable_conv2d npu_deformable_conv2dbk
npu_dense_lightning_indexer_grad_kl_loss npu_dense_lightning_indexer_softmax_lse npu_dequant_bias
npu_dequant_rope_quant_kvcache npu_dequant_swiglu_quant npu_diou npu_diou_backward
npu_dropout_backward npu_dropout_do_mask npu_dropout_gen_mask npu_dropout_with_add_softmax
npu_dropout_with_add_softmax_backward npu_dtype_cast npu_dtype_cast_ npu_dtype_cast_backward
npu_dual_level_quant_matmul npu_dynamic_block_mx_quant npu_dynamic_block_quant
npu_dynamic_dual_level_mx_quant npu_dynamic_mx_quant npu_dynamic_mx_quant_with_dual_axis
npu_dynamic_quant npu_dynamic_quant_asymmetric npu_fast_gelu npu_fast_gelu_backward npu_ffn
npu_ffn_to_attention npu_ffn_worker_batching npu_format_cast npu_format_cast_
npu_fused_attention_layernorm_qkv_fwd npu_fused_attention_qkv_grad npu_fused_attention_score
npu_fused_attention_score_backward npu_fused_attention_score_fwd npu_fused_attention_score_grad
npu_fused_causal_conv1d npu_fused_causal_conv1d_v2 npu_fused_cross_entropy_loss_with_max_sum
npu_fused_floyd_attention npu_fused_floyd_attention_backward npu_fused_infer_attention_score
npu_fused_infer_attention_score_v2 npu_fused_linear_cross_entropy_loss_with_max_sum_backward
npu_fused_linear_online_max_sum npu_fused_matmul npu_fusion_attention npu_fusion_attention_grad
npu_fusion_attention_grad_v2 npu_fusion_attention_grad_v3 npu_fusion_attention_v2
npu_fusion_attention_v3 npu_gather_backward npu_gather_pa_kv_cache npu_gather_pa_kv_cache_functional
npu_gather_sparse_index npu_gather_sparse_index_backward npu_geglu npu_geglu_grad npu_gelu
npu_gelu_backward npu_gelu_mul npu_gelu_quant npu_gemma_rms_norm npu_get_float_status npu_giou
npu_giou_backward npu_gmm_alltoallv npu_grid_assign_positive npu_group_norm_silu
npu_group_norm_swish npu_group_norm_swish_grad npu_group_quant npu_grouped_dynamic_block_quant
npu_grouped_dynamic_mx_quant npu_grouped_matmul npu_grouped_matmul_add npu_grouped_matmul_add_
npu_grouped_matmul_finalize_routing npu_grouped_matmul_swiglu_quant
npu_grouped_matmul_swiglu_quant_v2 npu_gru npu_gru_backward npu_hans_decode npu_hans_encode npu_ifmr
npu_incre_flash_attention npu_indexing npu_interleave_rope npu_iou npu_kronecker_quant
npu_kv_quant_sparse_flash_attention npu_kv_rmsnorm_rope_cache npu_kv_rmsnorm_rope_cache_v2
npu_kv_rmsnorm_rope_cache_v2_functional npu_layer_norm_eval npu_layernorm_grad npu_lightning_indexer
npu_lightning_indexer_grad npu_linear npu_linear_backward npu_lstm npu_lstm_backward npu_lstm_cell
npu_lstm_cell_backward npu_lstm_data npu_lstm_data_backward npu_masked_causal_conv1d
npu_masked_causal_conv1d_backward npu_masked_fill_range npu_masked_softmax_with_rel_pos_bias
npu_matmul_all_to_all npu_matmul_compress_dequant npu_max npu_max_backward npu_mhc_post
npu_mhc_post_backward npu_mhc_pre npu_mhc_pre_backward npu_mhc_sinkhorn npu_mhc_sinkhorn_backward
npu_min npu_min_backward npu_mish npu_mish_backward npu_mla_prolog npu_mla_prolog_v2
npu_mla_prolog_v3 npu_mla_prolog_v3_functional npu_mm_all_reduce_base npu_mm_reduce_scatter_base
npu_moe_compute_expert_tokens npu_moe_distribute_combine npu_moe_distribute_combine_add_rms_norm
npu_moe_distribute_combine_v2 npu_moe_distribute_dispatch npu_moe_distribute_dispatch_v2
npu_moe_finalize_routing npu_moe_gating_top_k npu_moe_gating_top_k_backward
npu_moe_gating_top_k_softmax npu_moe_gating_top_k_softmax_v2 npu_moe_init_routing
npu_moe_init_routing_quant npu_moe_init_routing_v2 npu_moe_re_routing npu_moe_token_permute
npu_moe_token_permute_grad npu_moe_token_permute_grad_v2 npu_moe_token_permute_with_routing_map
npu_moe_token_permute_with_routing_map_grad npu_moe_token_unpermute npu_moe_token_unpermute_grad
npu_moe_token_unpermute_grad_v2 npu_moe_token_unpermute_with_routing_map
npu_moe_token_unpermute_with_routing_map_grad npu_moe_update_expert npu_mrope
npu_multi_head_attention npu_multi_head_attention_backward npu_nms_rotated npu_nms_v4
npu_nms_with_mask npu_normalize_batch npu_nsa_compress npu_nsa_compress_attention
npu_nsa_compress_attention_infer npu_nsa_compress_grad npu_nsa_compress_infer
npu_nsa_select_attention npu_nsa_select_attention_grad npu_nsa_select_attention_infer npu_one_hot
npu_pad npu_prefetch npu_prompt_flash_attention npu_ps_roi_pooling npu_ps_roi_pooling_backward
npu_ptiou npu_qkv_rms_norm_rope_cache npu_qkv_rms_norm_rope_cache_functional npu_quant_conv2d
npu_quant_fusion_attention npu_quant_fusion_attention_backward npu_quant_gmm_alltoallv
npu_quant_grouped_matmul_dequant npu_quant_lightning_indexer npu_quant_matmul
npu_quant_matmul_all_to_all npu_quant_matmul_dequant npu_quant_matmul_gelu
npu_quant_matmul_reduce_sum npu_quant_max npu_quant_mm_reduce_scatter npu_quant_scatter
npu_quant_scatter_ npu_quantize npu_random_choice_with_mask npu_recurrent_gated_delta_rule
npu_recurrent_gated_delta_rule_functional npu_renorm_backward npu_reshape npu_ring_attention_update
npu_rms_norm npu_rms_norm_backward npu_rms_norm_dynamic_mx_quant npu_rms_norm_quant
npu_rms_norm_quant_v2 npu_roi_align npu_roi_alignbk npu_rope_quant_kvcache npu_rotary_mul
npu_rotary_mul_backward npu_rotate_quant npu_rotated_box_decode npu_rotated_box_encode
npu_rotated_iou npu_rotated_overlaps npu_scaled_masked_softmax npu_scaled_masked_softmax_backward
npu_scatter npu_scatter_list npu_scatter_list_ npu_scatter_nd_update npu_scatter_nd_update_
npu_scatter_pa_cache npu_scatter_pa_kv_cache npu_scatter_pa_kv_cache_functional npu_sign_bits_pack
npu_sign_bits_unpack npu_silu npu_silu_ npu_silu_backward npu_sim_exponential_ npu_slice
npu_softmax_cross_entropy_with_logits npu_softmax_cross_entropy_with_logits_backward npu_sort_v2
npu_sparse_flash_attention npu_sparse_flash_attention_grad npu_sparse_lightning_indexer_grad_kl_loss
npu_stride_add npu_stride_copy npu_sub_sample npu_swiglu npu_swiglu_backward npu_swiglu_group_quant
npu_swiglu_group_quant_backward npu_swiglu_mx_quant npu_swiglu_mx_quant_with_dual_axis
npu_swiglu_quant npu_top_k_top_p npu_top_k_top_p_sample npu_trans_quant_param npu_transpose
npu_transpose_batchmatmul npu_transpose_quant_batchmatmul npu_view_copy npu_weight_quant_batchmatmul
npu_weight_quant_preprocess npu_yolo_boxes_encode obfuscation_calculate obfuscation_finalize
obfuscation_initialize one_ repeat_interleave_backward_int repeat_interleave_backward_tensor
scatter_update scatter_update_ slow_conv_dilated2d_backward slow_conv_transpose2d_backward
stft_backward unsafe_empty_with_format
""".split()

PUBLIC_OPS = """
_npu_dropout empty_with_swapped_memory fast_gelu npu_advance_step_flashattn npu_all_gather_base_mm
npu_alloc_float_status npu_alltoallv_gmm npu_alltoallv_quant_gmm npu_anchor_response_flags
npu_anti_quant npu_apply_rotary_pos_emb npu_batch_nms npu_bert_apply_adam npu_block_sparse_attention
npu_bmmV2 npu_bounding_box_decode npu_bounding_box_encode npu_ciou npu_clear_float_status
npu_clipped_swiglu npu_confusion_transpose npu_conv3d npu_convert_weight_to_int4pack
npu_cross_entropy_loss npu_deformable_conv2d npu_dense_lightning_indexer_grad_kl_loss
npu_dense_lightning_indexer_softmax_lse npu_diou npu_dropout_with_add_softmax
npu_dynamic_block_quant npu_dynamic_quant npu_dynamic_quant_asymmetric npu_fast_gelu npu_ffn
npu_format_cast npu_format_cast_ npu_fused_attention_score npu_fused_causal_conv1d
npu_fusion_attention npu_gather_sparse_index npu_gelu_mul npu_get_float_status npu_giou
npu_gmm_alltoallv npu_grid_assign_positive npu_group_norm_silu npu_group_norm_swish
npu_grouped_matmul npu_grouped_matmul_finalize_routing npu_incre_flash_attention npu_indexing
npu_iou npu_kv_quant_sparse_flash_attention npu_lightning_indexer npu_linear npu_lstm
npu_masked_causal_conv1d npu_max npu_mhc_post npu_mhc_post_backward npu_mhc_sinkhorn npu_mla_prolog
npu_mla_prolog_v2 npu_mm_all_reduce_base npu_mm_reduce_scatter_base npu_moe_compute_expert_tokens
npu_moe_finalize_routing npu_moe_gating_top_k_backward npu_moe_gating_top_k_softmax
npu_moe_gating_top_k_softmax_v2 npu_moe_init_routing npu_moe_update_expert npu_mrope
npu_multi_head_attention npu_nms_v4 npu_nms_with_mask npu_one_hot npu_pad npu_prefetch
npu_prompt_flash_attention npu_ps_roi_pooling npu_quant_gmm_alltoallv npu_quant_lightning_indexer
npu_quant_matmul npu_quant_matmul_gelu npu_quant_matmul_reduce_sum npu_quant_scatter
npu_quant_scatter_ npu_quantize npu_random_choice_with_mask npu_recurrent_gated_delta_rule
npu_recurrent_gated_delta_rule_functional npu_ring_attention_update npu_rms_norm npu_roi_align
npu_rotary_mul npu_rotate_quant npu_rotated_iou npu_rotated_overlaps npu_scaled_masked_softmax
npu_scatter_nd_update npu_scatter_nd_update_ npu_scatter_pa_kv_cache npu_sign_bits_pack
npu_sign_bits_unpack npu_sim_exponential_ npu_slice npu_softmax_cross_entropy_with_logits
npu_sparse_flash_attention npu_sparse_lightning_indexer_grad_kl_loss npu_swiglu
npu_trans_quant_param npu_transpose npu_transpose_batchmatmul npu_transpose_quant_batchmatmul
npu_weight_quant_batchmatmul npu_yolo_boxes_encode scatter_update scatter_update_
""".split()

STATIC_ALL = ['HiFloat8Tensor', 'erase_stream', 'matmul_checksum']
EXPECTED_ALL = STATIC_ALL + PUBLIC_OPS

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# Outputs are compared with the float64 reference rounded to the output dtype: float32
# to 1e-5, float16/bfloat16 to about two units in the last place (gradients, which go
# through reductions, get twice that).
FWD_TOL = {
    torch.float32: dict(rtol=1e-5, atol=1e-5),
    torch.float16: dict(rtol=2e-3, atol=2e-3),
    torch.bfloat16: dict(rtol=1.6e-2, atol=1.6e-2),
}
BWD_TOL = {
    torch.float32: dict(rtol=1e-4, atol=1e-4),
    torch.float16: dict(rtol=4e-3, atol=4e-3),
    torch.bfloat16: dict(rtol=3e-2, atol=3e-2),
}


def as_ref(*ts):
    """float64 CPU copies of the op inputs (same values), keeping requires_grad."""
    return [t.detach().cpu().double().requires_grad_(t.requires_grad) for t in ts]


def check_grads(outs, inputs, ref_outs, ref_inputs, dtype, seed=100):
    """Autograd of the op vs autograd of the reference for the same random cotangents."""
    outs = [o for o in outs]
    cots = [rand(o.shape, o.dtype, o.device, seed=seed + i) for i, o in enumerate(outs)]
    wrt = [t for t in inputs if t.requires_grad]
    ref_wrt = [t for t in ref_inputs if t.requires_grad]
    grads = torch.autograd.grad(outs, wrt, cots)
    ref_grads = torch.autograd.grad(ref_outs, ref_wrt, [c.cpu().double() for c in cots], retain_graph=True)
    assert len(grads) == len(ref_grads) > 0
    for g, rg, t in zip(grads, ref_grads, wrt):
        assert g.dtype == t.dtype and g.device == t.device
        assert_match(g, rg, BWD_TOL[dtype])


params = pytest.mark.parametrize("device,dtype", [(d, t) for d in DEVICES for t in DTYPES],
                                 ids=lambda v: str(v).replace("torch.", ""))


# ------------------------------------------------------------------ references


def ref_rms_norm(x, gamma, eps):
    dims = tuple(range(x.dim() - gamma.dim(), x.dim()))
    rstd = 1.0 / torch.sqrt((x * x).mean(dims, keepdim=True) + eps)
    return x * rstd * gamma, rstd


def ref_gelu(x, tanh=False):
    if tanh:
        return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))


def ref_sigmoid(x):
    return 1 / (1 + torch.exp(-x))


def ref_rotary(x, r1, r2, mode):
    d = x.shape[-1]
    r1 = r1.expand(x.shape)
    r2 = r2.expand(x.shape)
    if mode == "half":
        h = d // 2
        x1, x2 = x[..., :h], x[..., h:]
        first = x1 * r1[..., :h] - x2 * r2[..., :h]
        second = x2 * r1[..., h:] + x1 * r2[..., h:]
        return torch.cat([first, second], -1)
    even, odd = x[..., 0::2], x[..., 1::2]
    out_even = even * r1[..., 0::2] - odd * r2[..., 0::2]
    out_odd = odd * r1[..., 1::2] + even * r2[..., 1::2]
    return torch.stack([out_even, out_odd], -1).reshape(x.shape)


def ref_masked_softmax(x, mask, scale):
    z = torch.where(mask, torch.full_like(x, -10000.0), x * scale)
    e = torch.exp(z - z.max(-1, keepdim=True).values)
    return e / e.sum(-1, keepdim=True)


# ------------------------------------------------------------------- registry


def test_every_schema_is_registered():
    from torch_npu.op_plugin import _registry
    s = _registry.summary()
    assert s["source_rows"] == 444
    assert s["overloads"] == 419 and s["defined"] == 419 and s["failed"] == 0, s
    ops = sorted(n for n in torch._C._dispatch_get_all_op_names() if n.startswith("npu::"))
    assert len(ops) == 419
    assert sum(len(getattr(torch.ops.npu, n).overloads()) for n in CUSTOM_OP_NAMES) == 419
    assert s["emulated_overloads"] + s["not_emulated_overloads"] == 419


def test_every_name_is_exported():
    assert len(CUSTOM_OP_NAMES) == 398 == len(set(CUSTOM_OP_NAMES))
    for name in CUSTOM_OP_NAMES:
        packet = getattr(torch.ops.npu, name)
        assert isinstance(packet, torch._ops.OpOverloadPacket), name
        assert getattr(torch_npu, name) is packet, name


def test_torch_npu_all_is_the_real_list():
    assert len(PUBLIC_OPS) == 119
    assert torch_npu.__all__ == EXPECTED_ALL
    for name in torch_npu.__all__:
        assert hasattr(torch_npu, name), name


SUFFIX_RE = (r"\n\[ERROR\] \d{4}-\d{2}-\d{2}-\d{2}:\d{2}:\d{2} \(PID:%d, Device:-?\d+, RankID:-?\d+\) "
             r"ERR00007 PTA feature not supported" % __import__("os").getpid())


def test_legacy_torch_names_raise_deprecation():
    assert "ERR00007" in pta_error(ErrCode.NOT_SUPPORT)
    for name in CUSTOM_OP_NAMES:
        fn = getattr(torch, name)
        with pytest.raises(RuntimeError) as info:
            fn(torch.ones(1))
        text = ("torch.%s is deprecated and will be removed in future version. Use torch_npu.%s instead."
                % (name, name))
        assert re.fullmatch(re.escape(text) + SUFFIX_RE, str(info.value)), str(info.value)


def not_emulated_text(name):
    return "torch_npu.%s (npu::%s) is not emulated yet on the CPU-emulated NPU." % (name.split(".")[0], name)


@pytest.mark.parametrize("device", DEVICES)
def test_not_emulated_op_raises(device):
    # Ops whose semantics the public docs leave open stay not emulated.
    x = torch.ones(2, 4, 8, device=device)
    with pytest.raises(NotImplementedError) as info:
        torch_npu.ffn_worker_scheduler(x, sync_group_size=1, execute_mode=0)
    assert str(info.value) == not_emulated_text("ffn_worker_scheduler")
    with pytest.raises(NotImplementedError) as info:
        torch.ops.npu.ffn_worker_scheduler.default(x)
    assert str(info.value) == not_emulated_text("ffn_worker_scheduler")


def test_kernels_per_state():
    from torch_npu.op_plugin import _registry
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    for name in _registry.DEFINED:
        q = "npu::" + name
        if name in _registry.OPAQUE:
            # value-dependent ops stay one node under torch.compile: device kernels + a fake kernel
            assert has(q, "CPU") and has(q, "PrivateUse1") and not has(q, "CompositeImplicitAutograd"), name
            assert has(q, "Meta"), name
        elif name in _registry.IMPLEMENTED:
            assert has(q, "CompositeImplicitAutograd") and not has(q, "CPU") and not has(q, "PrivateUse1"), name
        else:
            assert has(q, "CPU") and has(q, "PrivateUse1") and not has(q, "CompositeImplicitAutograd"), name
            # a not-emulated op infers shapes on Meta exactly when a Meta kernel was written for it
            assert has(q, "Meta") == (name in _registry.META), name
    assert len(_registry.IMPLEMENTED) >= 30
    assert not set(_registry.META) & set(_registry.IMPLEMENTED)


def test_extra_public_names():
    # HiFloat8Tensor is implemented in torch_npu.utils.hif8_tensor (tests/test_api_rest.py).
    from torch_npu.utils.hif8_tensor import HiFloat8Tensor
    assert torch_npu.HiFloat8Tensor is HiFloat8Tensor and "HiFloat8Tensor" in torch_npu.__all__
    t = torch.ones(4, device="npu")
    s = torch.npu.Stream()
    t.record_stream(s)
    assert torch_npu.erase_stream(t, s) is None
    with pytest.raises(TypeError):
        torch_npu.erase_stream(t, 1)
    with pytest.raises(TypeError):
        torch_npu.erase_stream("t", s)


@pytest.mark.parametrize("device", DEVICES)
def test_matmul_checksum(device):
    a = rand((3, 64, 48), torch.bfloat16, device, seed=1)
    b = rand((48, 32), torch.bfloat16, device, seed=2)
    c = torch.matmul(a, b)
    ok = torch_npu.matmul_checksum(a, b, c)
    assert ok.dtype == torch.bool and ok.dim() == 0 and ok.device.type == device
    assert not bool(ok)
    bad = c.clone()
    bad[1, 5, 7] += 4.0
    assert bool(torch_npu.matmul_checksum(a, b, bad))
    nan = c.clone()
    nan[0, 0, 0] = float("nan")
    assert bool(torch_npu.matmul_checksum(a, b, nan))
    a32, b32 = a.float(), b.float()
    assert not bool(torch_npu.matmul_checksum(a32, b32, a32 @ b32))
    with pytest.raises(RuntimeError):
        torch_npu.matmul_checksum(a, b, c[:, :1])


def test_docstrings_and_defaults():
    assert "rstd" in torch_npu.npu_rms_norm.__doc__
    x, g = rand((2, 8)), rand((8,), seed=1)
    y_default = torch_npu.npu_rms_norm(x, g)[0]
    torch.testing.assert_close(y_default, torch_npu.npu_rms_norm(x, g, epsilon=1e-6)[0], rtol=0, atol=0)
    assert not torch.allclose(y_default, torch_npu.npu_rms_norm(x, g, 10.0)[0])


def test_ops_doc_is_current():
    import importlib.util
    import os
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = importlib.util.spec_from_file_location("gen_ops_doc", os.path.join(root, "tools", "gen_ops_doc.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with open(os.path.join(root, "docs", "ops.md"), encoding="utf-8") as f:
        assert f.read() == mod.render(), "docs/ops.md is stale: run python tools/gen_ops_doc.py"


# ---------------------------------------------------------------------- norms


@params
def test_rms_norm(device, dtype):
    x = rand((2, 3, 16), dtype, device, grad=True)
    g = rand((16,), dtype, device, seed=1, grad=True)
    y, rstd = torch_npu.npu_rms_norm(x, g, 1e-5)
    rx, rg = as_ref(x, g)
    ry, rrstd = ref_rms_norm(rx, rg, 1e-5)
    assert_match(y, ry, FWD_TOL[dtype], dtype, device)
    assert rstd.shape == (2, 3, 1)
    assert_match(rstd, rrstd, FWD_TOL[torch.float32], torch.float32, device)
    check_grads([y, rstd], [x, g], [ry, rrstd], [rx, rg], dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_rms_norm_multi_dim_gamma(device):
    x = rand((3, 4, 5, 6), device=device, grad=True)
    g = rand((5, 6), device=device, seed=1, grad=True)
    y, rstd = torch_npu.npu_rms_norm(x, g)
    rx, rg = as_ref(x, g)
    ry, rrstd = ref_rms_norm(rx, rg, 1e-6)
    assert rstd.shape == (3, 4, 1, 1)
    assert_match(y, ry, FWD_TOL[torch.float32])
    assert_match(rstd, rrstd, FWD_TOL[torch.float32])
    check_grads([y], [x, g], [ry], [rx, rg], torch.float32)
    with pytest.raises(RuntimeError, match="gamma"):
        torch_npu.npu_rms_norm(x, rand((6, 5), device=device))


@params
def test_rms_norm_backward(device, dtype):
    x = rand((4, 12), dtype, device)
    g = rand((12,), dtype, device, seed=1)
    dy = rand((4, 12), dtype, device, seed=2)
    rx, rg = as_ref(x, g)
    rx.requires_grad_()
    rg.requires_grad_()
    ry, rrstd = ref_rms_norm(rx, rg, 1e-6)
    dx, dgamma = torch_npu.npu_rms_norm_backward(dy, x, g, rrstd.detach().float().to(device))
    rdx, rdg = torch.autograd.grad(ry, (rx, rg), dy.cpu().double())
    assert_match(dx, rdx, BWD_TOL[dtype], dtype, device)
    assert_match(dgamma, rdg, BWD_TOL[dtype], torch.float32, device)


@params
def test_add_rms_norm(device, dtype):
    x1 = rand((3, 16), dtype, device, grad=True)
    x2 = rand((3, 16), dtype, device, seed=1, grad=True)
    g = rand((16,), dtype, device, seed=2, grad=True)
    y, rstd, x = torch_npu.npu_add_rms_norm(x1, x2, g)
    r1, r2, rg = as_ref(x1, x2, g)
    rx = (r1 + r2).to(dtype).double()  # the kernel writes x = x1 + x2 in the input dtype
    ry, rrstd = ref_rms_norm(rx, rg, 1e-6)
    assert_match(x, rx, FWD_TOL[dtype], dtype, device)
    assert_match(y, ry, FWD_TOL[dtype], dtype, device)
    assert_match(rstd, rrstd, FWD_TOL[torch.float32], torch.float32, device)
    check_grads([y, x], [x1, x2, g], [ry, rx], [r1, r2, rg], dtype)


@params
def test_layer_norm_eval(device, dtype):
    x = rand((3, 4, 10), dtype, device)
    w = rand((10,), dtype, device, seed=1)
    b = rand((10,), dtype, device, seed=2)
    y = torch_npu.npu_layer_norm_eval(x, [10], w, b, 1e-5)
    rx, rw, rb = as_ref(x, w, b)
    mean = rx.mean(-1, keepdim=True)
    var = ((rx - mean) ** 2).mean(-1, keepdim=True)
    assert_match(y, (rx - mean) / torch.sqrt(var + 1e-5) * rw + rb, FWD_TOL[dtype], dtype, device)
    y0 = torch_npu.npu_layer_norm_eval(x, [10])
    assert_match(y0, (rx - mean) / torch.sqrt(var + 1e-5), FWD_TOL[dtype], dtype, device)


# --------------------------------------------------------------------- rotary


@params
@pytest.mark.parametrize("mode", ["half", "interleave"])
def test_rotary_mul(device, dtype, mode):
    x = rand((2, 3, 4, 8), dtype, device, grad=True)
    r1 = rand((1, 3, 1, 8), dtype, device, seed=1, low=-1, high=1, grad=True)
    r2 = rand((1, 3, 1, 8), dtype, device, seed=2, low=-1, high=1, grad=True)
    y = torch_npu.npu_rotary_mul(x, r1, r2, rotary_mode=mode)
    rx, rr1, rr2 = as_ref(x, r1, r2)
    ry = ref_rotary(rx, rr1, rr2, mode)
    assert_match(y, ry, FWD_TOL[dtype], dtype, device)
    other = ref_rotary(rx, rr1, rr2, "interleave" if mode == "half" else "half")
    assert not torch.allclose(ry, other)  # the two modes really differ on this input
    check_grads([y], [x, r1, r2], [ry], [rx, rr1, rr2], dtype)


def test_rotary_mul_default_mode_and_errors():
    x = rand((1, 2, 3, 4))
    c, s = rand((1, 1, 3, 4), seed=1), rand((1, 1, 3, 4), seed=2)
    torch.testing.assert_close(torch_npu.npu_rotary_mul(x, c, s),
                               ref_rotary(*as_ref(x, c, s), "half").float())
    with pytest.raises(RuntimeError, match="rotary_mode"):
        torch_npu.npu_rotary_mul(x, c, s, "sideways")
    with pytest.raises(NotImplementedError, match="rotate"):
        torch_npu.npu_rotary_mul(x, c, s, "half", torch.eye(4))


@params
@pytest.mark.parametrize("mode", ["half", "interleave"])
def test_rotary_mul_backward(device, dtype, mode):
    x = rand((2, 4, 3, 8), dtype, device)
    r1 = rand((1, 4, 1, 8), dtype, device, seed=1, low=-1, high=1)
    r2 = rand((1, 4, 1, 8), dtype, device, seed=2, low=-1, high=1)
    grad = rand((2, 4, 3, 8), dtype, device, seed=3)
    dx, dr1, dr2 = torch_npu.npu_rotary_mul_backward(grad, x, r1, r2, mode)
    rx, rr1, rr2 = [t.requires_grad_() for t in as_ref(x, r1, r2)]
    ref = torch.autograd.grad(ref_rotary(rx, rr1, rr2, mode), (rx, rr1, rr2), grad.cpu().double())
    for got, want, like in zip((dx, dr1, dr2), ref, (x, r1, r2)):
        assert_match(got, want, BWD_TOL[dtype], like.dtype, device)


@params
@pytest.mark.parametrize("mode", ["half", "interleave"])
def test_apply_rotary_pos_emb_in_place(device, dtype, mode):
    q = rand((2, 5, 4, 8), dtype, device)
    k = rand((2, 5, 2, 8), dtype, device, seed=1)
    cos = rand((2, 5, 1, 8), dtype, device, seed=2, low=-1, high=1)
    sin = rand((2, 5, 1, 8), dtype, device, seed=3, low=-1, high=1)
    rq, rk, rc, rs = as_ref(q, k, cos, sin)
    q_out, k_out = torch_npu.npu_apply_rotary_pos_emb(q, k, cos, sin, "BSND", mode)
    assert q_out is q and k_out is k  # updated in place and returned, as the kernel does
    assert_match(q, ref_rotary(rq, rc, rs, mode), FWD_TOL[dtype], dtype, device)
    assert_match(k, ref_rotary(rk, rc, rs, mode), FWD_TOL[dtype], dtype, device)


def test_apply_rotary_pos_emb_errors():
    q, k = rand((1, 2, 2, 4)), rand((1, 2, 2, 4), seed=1)
    c = rand((1, 2, 1, 4), seed=2)
    with pytest.raises(RuntimeError, match="broadcast"):
        torch_npu.npu_apply_rotary_pos_emb(q, k, rand((3, 2, 1, 4)), c)
    with pytest.raises(NotImplementedError, match="quarter"):
        torch_npu.npu_apply_rotary_pos_emb(q, k, c, c, "BSND", "quarter")
    with pytest.raises(RuntimeError, match="rotary_mode"):
        torch_npu.npu_apply_rotary_pos_emb(q, k, c, c, "BSND", "full")


# ---------------------------------------------------------------- activations


@params
@pytest.mark.parametrize("dim", [-1, 1])
def test_swiglu(device, dtype, dim):
    x = rand((3, 6, 10), dtype, device, low=-4, high=4, grad=True)
    y = torch_npu.npu_swiglu(x, dim=dim)
    (rx,) = as_ref(x)
    a, b = torch.split(rx, rx.shape[dim] // 2, dim)
    ry = a * ref_sigmoid(a) * b
    assert_match(y, ry, FWD_TOL[dtype], dtype, device)
    check_grads([y], [x], [ry], [rx], dtype)
    gy = rand(y.shape, dtype, device, seed=7)
    dx = torch_npu.npu_swiglu_backward(gy, x.detach(), dim)
    (rdx,) = torch.autograd.grad(ry, rx, gy.cpu().double())
    assert_match(dx, rdx, BWD_TOL[dtype], dtype, device)


@params
@pytest.mark.parametrize("approximate", [0, 1])
@pytest.mark.parametrize("activate_left", [False, True])
def test_geglu(device, dtype, approximate, activate_left):
    x = rand((4, 12), dtype, device, low=-3, high=3, grad=True)
    y, gelu = torch_npu.npu_geglu(x, -1, approximate, activate_left)
    (rx,) = as_ref(x)
    left, right = rx[:, :6], rx[:, 6:]
    gate, h = (left, right) if activate_left else (right, left)
    rgelu = ref_gelu(gate, tanh=approximate == 1)
    ry = h * rgelu
    assert_match(y, ry, FWD_TOL[dtype], dtype, device)
    assert_match(gelu, rgelu, FWD_TOL[dtype], dtype, device)
    wrong = gate * ref_gelu(h, approximate == 1)  # the other half activated
    assert not torch.allclose(ry, wrong, atol=1e-2)  # which half is activated matters
    check_grads([y], [x], [ry], [rx], dtype)
    gy = rand(y.shape, dtype, device, seed=9)
    dx = torch_npu.npu_geglu_grad(gy, x.detach(), gelu.detach(), -1, approximate, activate_left)
    (rdx,) = torch.autograd.grad(ry, rx, gy.cpu().double())
    assert_match(dx, rdx, BWD_TOL[dtype], dtype, device)


def test_geglu_default_activates_right_half():
    x = torch.tensor([[1.0, 2.0, -0.5, 3.0]])
    y, gelu = torch_npu.npu_geglu(x)  # dim=-1, approximate=1 (tanh), activate_left=False
    rg = ref_gelu(torch.tensor([[-0.5, 3.0]], dtype=torch.float64), tanh=True)
    torch.testing.assert_close(gelu.double(), rg)
    torch.testing.assert_close(y.double(), torch.tensor([[1.0, 2.0]], dtype=torch.float64) * rg)
    with pytest.raises(RuntimeError, match="approximate"):
        torch_npu.npu_geglu(x, approximate=2)


@params
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_family(device, dtype, approximate):
    x = rand((5, 8), dtype, device, low=-5, high=5, grad=True)
    y = torch_npu.npu_gelu(x, approximate=approximate)
    (rx,) = as_ref(x)
    ry = ref_gelu(rx, approximate == "tanh")
    assert_match(y, ry, FWD_TOL[dtype], dtype, device)
    check_grads([y], [x], [ry], [rx], dtype)
    gy = rand(y.shape, dtype, device, seed=5)
    (rdx,) = torch.autograd.grad(ry, rx, gy.cpu().double())
    dx = torch_npu.npu_gelu_backward(gy, x.detach(), approximate=approximate)
    assert_match(dx, rdx, BWD_TOL[dtype], dtype, device)
    ym = torch_npu.npu_gelu_mul(x, approximate=approximate)
    rym = ref_gelu(rx[:, :4], approximate == "tanh") * rx[:, 4:]
    assert_match(ym, rym, FWD_TOL[dtype], dtype, device)
    check_grads([ym], [x], [rym], [rx], dtype)


@params
def test_fast_gelu(device, dtype):
    x = rand((6, 7), dtype, device, low=-12, high=12, grad=True)
    (rx,) = as_ref(x)
    ry = rx / (1 + torch.exp(-1.702 * rx))  # = x * sigmoid(1.702 x)
    for op in (torch_npu.fast_gelu, torch_npu.npu_fast_gelu):
        y = op(x)
        assert_match(y, ry, FWD_TOL[dtype], dtype, device)
        check_grads([y], [x], [ry], [rx], dtype)
    gy = rand(x.shape, dtype, device, seed=4)
    (rdx,) = torch.autograd.grad(ry, rx, gy.cpu().double())
    assert_match(torch_npu.npu_fast_gelu_backward(gy, x.detach()), rdx, BWD_TOL[dtype], dtype, device)


def test_fast_gelu_is_not_gelu():
    x = torch.tensor([-3.0, -1.0, 0.5, 2.0])
    torch.testing.assert_close(torch_npu.fast_gelu(x), x * torch.sigmoid(1.702 * x))
    assert not torch.allclose(torch_npu.fast_gelu(x), torch.nn.functional.gelu(x), atol=1e-3)
    big = torch.tensor([-100.0, 100.0])
    assert torch.isfinite(torch_npu.npu_fast_gelu_backward(torch.ones(2), big)).all()


@params
def test_silu_and_mish(device, dtype):
    x = rand((4, 9), dtype, device, low=-6, high=6, grad=True)
    (rx,) = as_ref(x)
    rsilu = rx * ref_sigmoid(rx)
    rmish = rx * torch.tanh(torch.log1p(torch.exp(rx)))
    y = torch_npu.npu_silu(x)
    assert_match(y, rsilu, FWD_TOL[dtype], dtype, device)
    check_grads([y], [x], [rsilu], [rx], dtype)
    m = torch_npu.npu_mish(x)
    assert_match(m, rmish, FWD_TOL[dtype], dtype, device)
    check_grads([m], [x], [rmish], [rx], dtype)
    gy = rand(x.shape, dtype, device, seed=3)
    (rds,) = torch.autograd.grad(rsilu, rx, gy.cpu().double())
    assert_match(torch_npu.npu_silu_backward(gy, x.detach(), y.detach()), rds, BWD_TOL[dtype], dtype, device)
    (rdm,) = torch.autograd.grad(rmish, rx, gy.cpu().double())
    assert_match(torch_npu.npu_mish_backward(gy, x.detach()), rdm, BWD_TOL[dtype], dtype, device)
    z = x.detach().clone()
    out = torch_npu.npu_silu_(z)
    assert out is z
    assert_match(z, rsilu, FWD_TOL[dtype], dtype, device)


# -------------------------------------------------------------------- softmax


@params
def test_scaled_masked_softmax(device, dtype):
    x = rand((2, 3, 8, 8), dtype, device, low=-3, high=3, grad=True)
    gen = torch.Generator().manual_seed(11)
    mask = (torch.rand((2, 1, 8, 8), generator=gen) < 0.3)
    mask[0, 0, 2, :] = True  # a fully masked row: uniform output (fill -10000, not -inf)
    mask = mask.to(device)
    y = torch_npu.npu_scaled_masked_softmax(x, mask, 0.7)
    (rx,) = as_ref(x)
    ry = ref_masked_softmax(rx, mask.cpu(), 0.7)
    assert_match(y, ry, FWD_TOL[dtype], dtype, device)
    torch.testing.assert_close(y[0, :, 2].float().cpu(), torch.full((3, 8), 1 / 8))
    check_grads([y], [x], [ry], [rx], dtype)
    gy = rand(y.shape, dtype, device, seed=12)
    (rdx,) = torch.autograd.grad(ry, rx, gy.cpu().double())
    dx = torch_npu.npu_scaled_masked_softmax_backward(gy, y.detach(), mask, 0.7, False)
    assert_match(dx, rdx, BWD_TOL[dtype], dtype, device)
    assert (dx[mask.expand_as(dx)] == 0).all()


@pytest.mark.parametrize("device", DEVICES)
def test_scaled_masked_softmax_fixed_triu_mask(device):
    x = rand((2, 2, 6, 6), device=device, grad=True)
    ignored = torch.zeros((2, 1, 6, 6), dtype=torch.bool, device=device)
    y = torch_npu.npu_scaled_masked_softmax(x, ignored, 2.0, True)
    causal = torch.ones(6, 6, dtype=torch.bool).triu(1)
    (rx,) = as_ref(x)
    ry = ref_masked_softmax(rx, causal, 2.0)
    assert_match(y, ry, FWD_TOL[torch.float32])
    assert not torch.allclose(ry, ref_masked_softmax(rx, ignored.cpu(), 2.0))
    check_grads([y], [x], [ry], [rx], torch.float32)
    with pytest.raises(RuntimeError, match="bool"):
        torch_npu.npu_scaled_masked_softmax(x, ignored.float(), 1.0)


# -------------------------------------------------------------- shape / misc


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("transpose_first", [True, False])
def test_confusion_transpose(device, transpose_first):
    x = rand((2, 3, 4, 5), device=device, grad=True)
    xn = x.detach().cpu().numpy()
    if transpose_first:
        perm, shape = [2, 0, 1, 3], [4, 6, 5]  # not its own inverse
        ref = np.transpose(xn, perm).reshape(shape)
    else:
        perm, shape = [2, 0, 1], [2, 12, 5]
        ref = np.transpose(xn.reshape(shape), perm)
    y = torch_npu.npu_confusion_transpose(x, perm, shape, transpose_first)
    assert y.is_contiguous() and y.device.type == device
    np.testing.assert_array_equal(y.detach().cpu().numpy(), ref)
    gy = rand(y.shape, device=device, seed=1)
    gn = gy.cpu().numpy()
    inv = np.argsort(perm)
    if transpose_first:
        rdx = np.transpose(gn.reshape([x.shape[p] for p in perm]), inv)
    else:
        rdx = np.transpose(gn, inv).reshape(x.shape)
    (dx,) = torch.autograd.grad(y, x, gy)
    np.testing.assert_array_equal(dx.cpu().numpy(), rdx)
    dx2 = torch_npu.npu_confusion_transpose_backward(gy, perm, list(x.shape), transpose_first)
    np.testing.assert_array_equal(dx2.cpu().numpy(), rdx)


@pytest.mark.parametrize("device", DEVICES)
def test_transpose_slice_broadcast(device):
    x = rand((2, 3, 4), device=device)
    xn = x.cpu().numpy()
    y = torch_npu.npu_transpose(x, [2, 0, 1])
    assert y.is_contiguous() and y.data_ptr() != x.data_ptr()
    np.testing.assert_array_equal(y.cpu().numpy(), np.transpose(xn, [2, 0, 1]))
    same = torch_npu.npu_transpose(x, [0, 1, 2])
    assert same.data_ptr() != x.data_ptr()  # always a new tensor
    out = torch.empty(0, device=device)
    r = torch_npu.npu_transpose(x, [1, 2, 0], out=out)
    assert r.data_ptr() == out.data_ptr()
    np.testing.assert_array_equal(out.cpu().numpy(), np.transpose(xn, [1, 2, 0]))
    s = torch_npu.npu_slice(x, [1, 1, 1], [1, 2, -1])  # -1: to the end of the dim
    np.testing.assert_array_equal(s.cpu().numpy(), xn[1:2, 1:3, 1:4])
    out = torch.empty(0, device=device)
    torch_npu.npu_slice(x, [0, 2, 1], [2, 1, 2], out=out)
    np.testing.assert_array_equal(out.cpu().numpy(), xn[0:2, 2:3, 1:3])
    with pytest.raises(RuntimeError, match="out of range"):
        torch_npu.npu_slice(x, [0, 2, 0], [2, 2, 4])
    b = torch_npu.npu_broadcast(x[:, :1], [2, 3, 4])
    np.testing.assert_array_equal(b.cpu().numpy(), np.broadcast_to(xn[:, :1], (2, 3, 4)))
    assert b.is_contiguous()


@params
def test_linear_and_bmm(device, dtype):
    x = rand((3, 4, 6), dtype, device, grad=True)
    w = rand((5, 6), dtype, device, seed=1, grad=True)
    b = rand((5,), dtype, device, seed=2, grad=True)
    rx, rw, rb = as_ref(x, w, b)
    ry = torch.einsum("bsi,oi->bso", rx, rw) + rb
    y = torch_npu.npu_linear(x, w, b)
    assert_match(y, ry, BWD_TOL[dtype], dtype, device)
    check_grads([y], [x, w, b], [ry], [rx, rw, rb], dtype)
    gy = rand(y.shape, dtype, device, seed=3)
    rdx, rdw = torch.autograd.grad(ry, (rx, rw), gy.cpu().double())
    dx, dw = torch_npu.npu_linear_backward(gy, x.detach(), w.detach())
    assert_match(dx, rdx, BWD_TOL[dtype], dtype, device)
    assert_match(dw, rdw, BWD_TOL[dtype], dtype, device)
    m2 = rand((3, 6, 2), dtype, device, seed=4, grad=True)
    z = torch_npu.npu_bmmV2(x, m2, [])
    rm2 = m2.detach().cpu().double().requires_grad_()
    rz = torch.einsum("bij,bjk->bik", rx, rm2)
    assert_match(z, rz, BWD_TOL[dtype], dtype, device)
    check_grads([z], [x, m2], [rz], [rx, rm2], dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_one_hot(device):
    a = torch.tensor([5, 3, 2, 1], dtype=torch.int32, device=device)
    y = torch_npu.npu_one_hot(a, depth=5)
    expected = np.zeros((4, 5), np.float32)
    expected[1, 3] = expected[2, 2] = expected[3, 1] = 1  # index 5 is out of range: all off
    assert y.dtype == torch.float32 and y.device.type == device
    np.testing.assert_array_equal(y.cpu().numpy(), expected)
    idx = torch.tensor([[0, 2], [1, 7]], device=device)
    y = torch_npu.npu_one_hot(idx, 0, 3, 2.5, -1)
    ref = np.full((3, 2, 2), -1.0, np.float32)
    for i in range(2):
        for j in range(2):
            v = int(idx[i, j])
            if 0 <= v < 3:
                ref[v, i, j] = 2.5
    np.testing.assert_array_equal(y.cpu().numpy(), ref)


# ---------------------------------------------------- meta, fake, gradcheck


def _meta_cases():
    m = lambda *s, dtype=torch.float32: torch.empty(*s, device="meta", dtype=dtype)  # noqa: E731
    return [
        ("rms_norm", lambda: torch_npu.npu_rms_norm(m(2, 3, 8, dtype=torch.bfloat16), m(8, dtype=torch.bfloat16)),
         [((2, 3, 8), torch.bfloat16), ((2, 3, 1), torch.float32)]),
        ("rms_norm_backward", lambda: torch_npu.npu_rms_norm_backward(m(4, 8), m(4, 8), m(8), m(4, 1)),
         [((4, 8), torch.float32), ((8,), torch.float32)]),
        ("add_rms_norm", lambda: torch_npu.npu_add_rms_norm(m(2, 8, dtype=torch.float16), m(2, 8, dtype=torch.float16),
                                                            m(8, dtype=torch.float16)),
         [((2, 8), torch.float16), ((2, 1), torch.float32), ((2, 8), torch.float16)]),
        ("rotary_mul", lambda: torch_npu.npu_rotary_mul(m(2, 4, 3, 8), m(1, 4, 1, 8), m(1, 4, 1, 8), "interleave"),
         [((2, 4, 3, 8), torch.float32)]),
        ("rotary_mul_backward", lambda: torch_npu.npu_rotary_mul_backward(m(2, 4, 3, 8), m(2, 4, 3, 8),
                                                                          m(1, 4, 1, 8), m(1, 4, 1, 8)),
         [((2, 4, 3, 8), torch.float32), ((1, 4, 1, 8), torch.float32), ((1, 4, 1, 8), torch.float32)]),
        ("apply_rotary_pos_emb", lambda: torch_npu.npu_apply_rotary_pos_emb(m(1, 2, 4, 8), m(1, 2, 2, 8),
                                                                            m(1, 2, 1, 8), m(1, 2, 1, 8)),
         [((1, 2, 4, 8), torch.float32), ((1, 2, 2, 8), torch.float32)]),
        ("swiglu", lambda: torch_npu.npu_swiglu(m(3, 10, dtype=torch.float16)), [((3, 5), torch.float16)]),
        ("swiglu dim0", lambda: torch_npu.npu_swiglu(m(4, 3), 0), [((2, 3), torch.float32)]),
        ("geglu", lambda: torch_npu.npu_geglu(m(3, 10)), [((3, 5), torch.float32), ((3, 5), torch.float32)]),
        ("gelu_mul", lambda: torch_npu.npu_gelu_mul(m(3, 10)), [((3, 5), torch.float32)]),
        ("fast_gelu", lambda: torch_npu.npu_fast_gelu(m(3, 10)), [((3, 10), torch.float32)]),
        ("scaled_masked_softmax", lambda: torch_npu.npu_scaled_masked_softmax(
            m(2, 2, 8, 8, dtype=torch.float16), m(2, 1, 8, 8, dtype=torch.bool), 0.5),
         [((2, 2, 8, 8), torch.float16)]),
        ("confusion_transpose", lambda: torch_npu.npu_confusion_transpose(m(2, 3, 4, 5), [0, 2, 1, 3], [2, 4, 15],
                                                                          True),
         [((2, 4, 15), torch.float32)]),
        ("transpose", lambda: torch_npu.npu_transpose(m(2, 3, 4), [2, 0, 1]), [((4, 2, 3), torch.float32)]),
        ("linear", lambda: torch_npu.npu_linear(m(3, 6), m(5, 6), m(5)), [((3, 5), torch.float32)]),
        ("one_hot", lambda: torch_npu.npu_one_hot(m(4, dtype=torch.int32), depth=7), [((4, 7), torch.float32)]),
    ]


@pytest.mark.parametrize("name,fn,expected", _meta_cases(), ids=[c[0] for c in _meta_cases()])
def test_meta_shapes(name, fn, expected):
    out = fn()
    outs = out if isinstance(out, tuple) else (out,)
    assert [(tuple(o.shape), o.dtype) for o in outs] == expected
    assert all(o.device.type == "meta" for o in outs)


def test_fake_tensor_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        x = torch.empty(4, 6, 16, dtype=torch.bfloat16)
        g = torch.empty(16, dtype=torch.bfloat16)
        y, rstd = torch_npu.npu_rms_norm(x, g)
        z = torch_npu.npu_swiglu(x)
    assert y.shape == (4, 6, 16) and rstd.shape == (4, 6, 1) and rstd.dtype == torch.float32
    assert z.shape == (4, 6, 8)


def test_gradcheck_float64():
    d = dict(dtype=torch.float64, grad=True)
    x, g = rand((3, 5), seed=1, **d), rand((5,), seed=2, **d)
    assert torch.autograd.gradcheck(lambda a, b: torch_npu.npu_rms_norm(a, b, 1e-3), (x, g))
    x = rand((2, 2, 3, 4), seed=3, **d)
    r1, r2 = rand((1, 2, 1, 4), seed=4, **d), rand((1, 2, 1, 4), seed=5, **d)
    assert torch.autograd.gradcheck(lambda a, b, c: torch_npu.npu_rotary_mul(a, b, c, "interleave"), (x, r1, r2))
    x = rand((3, 6), seed=6, **d)
    assert torch.autograd.gradcheck(lambda a: torch_npu.npu_swiglu(a), (x,))
    assert torch.autograd.gradcheck(lambda a: torch_npu.npu_geglu(a, -1, 0, True), (x,))
    assert torch.autograd.gradcheck(lambda a: torch_npu.fast_gelu(a), (x,))
    x = rand((1, 2, 4, 4), seed=7, **d)
    mask = torch.rand((1, 1, 4, 4), generator=torch.Generator().manual_seed(8)) < 0.3
    assert torch.autograd.gradcheck(lambda a: torch_npu.npu_scaled_masked_softmax(a, mask, 0.5), (x,))


def test_gradcheck_on_npu():
    d = dict(dtype=torch.float64, device="npu", grad=True)
    x, g = rand((3, 5), seed=1, **d), rand((5,), seed=2, **d)
    assert torch.autograd.gradcheck(lambda a, b: torch_npu.npu_add_rms_norm(a, a * 0.5, b)[0], (x, g))
