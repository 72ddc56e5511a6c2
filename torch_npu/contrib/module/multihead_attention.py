"""fairseq-style MultiheadAttention on the fused ``npu_multi_head_attention`` kernel.

As in torch_npu, ``forward`` computes only through the fused kernel: call
``MHAConfig.set_fussion()`` first; without it ``forward`` returns ``(None, None)`` (torch_npu
leaves the unfused fairseq path out of this module). Inputs are flattened:
query (bsz * tgt_len, embed_dim), key/value (bsz * src_len, embed_dim).
"""
import math
from typing import Dict, Optional, Tuple

import torch
import torch.nn as nn
from torch import Tensor
from torch.nn import Parameter

import torch_npu
from torch_npu.contrib.module.ensemble_dropout import NpuCachedDropout

__all__ = ["Matmul_transpose", "MultiheadAttention"]

dropout_class = NpuCachedDropout


def quant_noise(module, p, block_size):
    """Quant-Noise (Fan et al. 2020): in training, drop random weight blocks of ``block_size``
    input features with probability ``p`` and rescale by 1/(1-p). Linear layers only here."""
    if p <= 0:
        return module
    if not isinstance(module, nn.Linear):
        raise ValueError("quant_noise: only nn.Linear is supported")
    if module.weight.size(1) % block_size != 0:
        raise ValueError("Input features must be a multiple of block sizes")

    def drop_blocks(mod, inputs):
        if mod.training:
            out_features, in_features = mod.weight.shape
            mask = torch.zeros(in_features // block_size * out_features, device=mod.weight.device)
            mask.bernoulli_(p)
            mask = mask.repeat_interleave(block_size, -1).view(-1, in_features).to(torch.bool)
            mod.weight.data = (1 / (1 - p)) * mod.weight.masked_fill(mask, 0)

    module.register_forward_pre_hook(drop_blocks)
    return module


class NpuLinear(nn.Linear):
    """nn.Linear on ``npu_linear`` for 2-d and 3-d inputs."""

    def forward(self, x):
        if x.dim() == 3:
            rows = x.reshape(-1, self.in_features)
            return torch_npu.npu_linear(rows, self.weight, self.bias).view(x.shape[0], x.shape[1], self.out_features)
        if x.dim() == 2:
            return torch_npu.npu_linear(x, self.weight, self.bias)
        raise RuntimeError('not support this dim')


class MHAConfig:
    use_fussion_mha = False

    @classmethod
    def set_fussion(cls):
        cls.use_fussion_mha = True


class MatmulApply(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor1, tensor2):
        ctx.save_for_backward(tensor1, tensor2)
        return torch.matmul(tensor1, tensor2.transpose(-2, -1)).detach()

    @staticmethod
    def backward(ctx, grad):
        tensor1, tensor2 = ctx.saved_tensors
        return (torch_npu.npu_bmmV2(grad, tensor2, []),
                torch_npu.npu_bmmV2(grad.transpose(-2, -1), tensor1, []))


def Matmul_transpose(tensor1, tensor2):
    """``tensor1 @ tensor2.transpose(-2, -1)``."""
    return MatmulApply.apply(tensor1, tensor2)


class MultiheadAttention(nn.Module):
    def __init__(self, embed_dim, num_heads, kdim=None, vdim=None, dropout=0.0, bias=True, add_bias_kv=False,
                 add_zero_attn=False, self_attention=False, encoder_decoder_attention=False, q_noise=0.0,
                 qn_block_size=8):
        super().__init__()
        self.embed_dim = embed_dim
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self.qkv_same_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.num_heads = num_heads
        self.dropout_module = dropout_class(dropout, module_name=self.__class__.__name__)
        self.dropout_prob = dropout
        self.use_dropout_optim = dropout_class is NpuCachedDropout
        self.head_dim = embed_dim // num_heads
        if self.head_dim * num_heads != self.embed_dim:
            raise ValueError("embed_dim must be divisible by num_heads")
        self.scaling = self.head_dim ** -0.5
        self.self_attention = self_attention
        self.encoder_decoder_attention = encoder_decoder_attention
        if self.self_attention and not self.qkv_same_dim:
            raise ValueError("Self-attention requires query, key and value to be of the same size")
        self.k_proj = quant_noise(NpuLinear(self.kdim, embed_dim, bias=bias), q_noise, qn_block_size)
        self.v_proj = quant_noise(NpuLinear(self.vdim, embed_dim, bias=bias), q_noise, qn_block_size)
        self.q_proj = quant_noise(NpuLinear(embed_dim, embed_dim, bias=bias), q_noise, qn_block_size)
        self.out_proj = quant_noise(NpuLinear(embed_dim, embed_dim, bias=bias), q_noise, qn_block_size)
        if add_bias_kv:
            self.bias_k = Parameter(torch.empty(1, 1, embed_dim))
            self.bias_v = Parameter(torch.empty(1, 1, embed_dim))
        else:
            self.bias_k = self.bias_v = None
        self.add_zero_attn = add_zero_attn
        self.reset_parameters()
        self.onnx_trace = False
        self.tpu = False

    def prepare_for_onnx_export_(self):
        self.onnx_trace = True

    def prepare_for_tpu_(self, **kwargs):
        self.tpu = True

    def reset_parameters(self):
        # fairseq: scaled Xavier init of the in-projections when q/k/v share a size.
        gain = 1 / math.sqrt(2) if self.qkv_same_dim else 1.
        for proj in (self.k_proj, self.v_proj, self.q_proj):
            nn.init.xavier_uniform_(proj.weight, gain=gain)
        nn.init.xavier_uniform_(self.out_proj.weight)
        if self.out_proj.bias is not None:
            nn.init.constant_(self.out_proj.bias, 0.0)
        if self.bias_k is not None:
            nn.init.xavier_normal_(self.bias_k)
        if self.bias_v is not None:
            nn.init.xavier_normal_(self.bias_v)

    def transpose_for_scores(self, x):
        """(B*S, heads*dim) -> (B, heads, S, dim); needs ``batch_size``/``squence_length`` set on the module."""
        new_x_shape = (self.batch_size, self.squence_length, self.num_heads, self.head_dim)
        return torch_npu.npu_confusion_transpose(x, (0, 2, 1, 3), new_x_shape, False)

    def forward(self, query, key: Optional[Tensor], value: Optional[Tensor], bsz, tgt_len, s_len,
                key_padding_mask: Optional[Tensor] = None,
                incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
                need_weights: bool = True, static_kv: bool = False, attn_mask: Optional[Tensor] = None,
                before_softmax: bool = False, need_head_weights: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
        """Fused attention output (bsz * tgt_len, embed_dim) and None; ``key_padding_mask`` is the
        additive mask broadcast to (bsz, heads, tgt_len, src_len)."""
        if MHAConfig.use_fussion_mha:
            return self.multi_attn(query, key, value, key_padding_mask, bsz, tgt_len), None
        return None, None

    def multi_attn(self, query, key, value, key_padding_mask, bsz, tgt_len):
        src_len = key.size(0) // bsz
        dropout_mask = None
        if self.use_dropout_optim:
            dropout_mask = self.dropout_module([(bsz, self.num_heads, tgt_len, src_len), query.dtype, query.device])
        attn = torch_npu.npu_multi_head_attention(
            query, key, value, self.q_proj.weight, self.k_proj.weight, self.v_proj.weight, key_padding_mask,
            self.out_proj.weight, self.q_proj.bias, self.k_proj.bias, self.v_proj.bias, self.out_proj.bias,
            dropout_mask, self.num_heads, self.head_dim, src_len, tgt_len, self.dropout_prob, True)
        return attn[0]

    def apply_sparse_mask(self, attn_weights, tgt_len: int, src_len: int, bsz: int):
        return attn_weights

    def upgrade_state_dict_named(self, state_dict, name):
        """Split a legacy packed ``in_proj_weight``/``in_proj_bias`` into q/k/v projections."""
        prefix = name + "." if name != "" else ""
        for key in list(state_dict.keys()):
            if not key.endswith(prefix + "in_proj_weight"):
                continue
            packed = state_dict.pop(key)
            dim = packed.shape[0] // 3
            state_dict[prefix + "q_proj.weight"] = packed[:dim]
            state_dict[prefix + "k_proj.weight"] = packed[dim:2 * dim]
            state_dict[prefix + "v_proj.weight"] = packed[2 * dim:]
            bias_key = prefix + "in_proj_bias"
            if bias_key in state_dict:
                packed_bias = state_dict.pop(bias_key)
                state_dict[prefix + "q_proj.bias"] = packed_bias[:dim]
                state_dict[prefix + "k_proj.bias"] = packed_bias[dim:2 * dim]
                state_dict[prefix + "v_proj.bias"] = packed_bias[2 * dim:]
