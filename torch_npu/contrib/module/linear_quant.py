"""Quantised linear layer ``y = dequant(x_q @ W_q^T + bias)`` on ``npu_quant_matmul``."""
import torch
import torch.nn as nn
from torch import Tensor
from torch.nn.parameter import Parameter

import torch_npu
from torch_npu.utils._error_code import ErrCode, ops_error

__all__ = ["LinearQuant"]


class LinearQuant(nn.Module):
    """int8 (A8W8) or int32-packed int4 (A4W4) linear layer.

    ``weight`` (out_features, in_features) quantised, ``scale`` (out_features,) (or 1),
    optional float32 ``offset``, float32 ``pertoken_scale`` and int32 ``bias``. A float32
    ``scale`` without ``pertoken_scale`` is packed with ``npu_trans_quant_param`` first, as
    torch_npu does; the op then computes ``(x @ W^T + bias) * scale (+ offset)`` in
    ``output_dtype``. Parameters are created empty: load them before use.
    """
    in_features: int
    out_features: int

    def __init__(self, in_features: int, out_features: int, *, bias: bool = True, offset: bool = False,
                 pertoken_scale: bool = False, device=None, dtype=None, output_dtype=None) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = Parameter(torch.empty((out_features, in_features), device=device), False)
        self.scale = Parameter(torch.empty(out_features, device=device), False)
        self.output_dtype = output_dtype
        if offset:
            self.offset = Parameter(torch.empty(out_features, dtype=torch.float32, device=device), False)
        else:
            self.register_parameter('offset', None)
        if pertoken_scale:
            self.pertoken_scale = Parameter(torch.empty(out_features, dtype=torch.float32, device=device), False)
        else:
            self.register_parameter('pertoken_scale', None)
        if bias:
            self.bias = Parameter(torch.empty(out_features, dtype=torch.int32, device=device), False)
        else:
            self.register_parameter('bias', None)

    def _check_dtypes(self, x):
        same_int = (x.dtype == self.weight.dtype) and x.dtype in (torch.int32, torch.int8)
        if not same_int:
            raise ValueError("input and weight should be both torch.int32 or both torch.int8 datatype, "
                             f"but now input is {x.dtype}, weight is {self.weight.dtype}." + ops_error(ErrCode.TYPE))

    def forward(self, linear_quant_input: Tensor) -> Tensor:
        self._check_dtypes(linear_quant_input)
        scale = self.scale
        if self.scale.dtype == torch.float32 and self.pertoken_scale is None:
            scale = torch_npu.npu_trans_quant_param(self.scale, self.offset)
        return torch_npu.npu_quant_matmul(linear_quant_input, self.weight.transpose(-2, -1), scale,
                                          offset=self.offset, pertoken_scale=self.pertoken_scale, bias=self.bias,
                                          output_dtype=self.output_dtype)
