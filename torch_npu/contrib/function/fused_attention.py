"""BERT fused attention (optionally with the preceding LayerNorm) on the NZ-format fused kernels.

Not emulated: on hardware these need inputs in the FRACTAL_NZ storage format (format 29)
and the ``npu_fused_attention_score_fwd`` / ``npu_fused_attention_layernorm_qkv_fwd``
kernels, whose exact numerics (layouts of the returned softmax and dropout mask) are
not documented in the reference material. Calling them raises NotImplementedError.
"""
__all__ = ["npu_fused_attention", "npu_fused_attention_with_layernorm"]


def _not_emulated(name):
    raise NotImplementedError(
        "torch_npu.contrib.function.%s is not emulated on the CPU-emulated NPU: it needs the "
        "FRACTAL_NZ fused-attention kernels; use torch.nn.functional.scaled_dot_product_attention "
        "(or torch_npu.npu_fusion_attention) instead." % name)


def npu_fused_attention(*args, **kwargs):
    """Fused BERT self-attention (hidden_states, attention_mask, q/k/v kernels and biases, scale,
    keep_prob). Not emulated: raises NotImplementedError."""
    _not_emulated("npu_fused_attention")


def npu_fused_attention_with_layernorm(*args, **kwargs):
    """:func:`npu_fused_attention` after a LayerNorm (gamma, beta). Not emulated: raises
    NotImplementedError."""
    _not_emulated("npu_fused_attention_with_layernorm")
