"""npu_alltoallv_quant_gmm / npu_quant_gmm_alltoallv: the MX-quantised AlltoAllv + grouped matmul ops.

Same routing as ``npu_alltoallv_gmm`` / ``npu_gmm_alltoallv`` (``comm/alltoallv_gmm.py``: counts
``[rank * e + expert]``, Permute to (expert, source rank) after the exchange, Unpermute to
(destination rank, expert) before it). The matmuls follow the torch_npu docs:
``gmm_y = (x * x_scale) @ (w * w_scale)`` per expert and ``mm_y = (mm_x * mm_x_scale) @
(mm_weight * mm_weight_scale)``, in float32, cast to ``gmm_y_dtype`` / ``mm_y_dtype``
(float16/bfloat16, equal when both are given).

Emulated: MX mode (quant modes 6 or None with float8_e8m0fnu scales, group size ``[1, 1, 32]``):
``x`` float8_e4m3fn/float8_e5m2, ``x_scale (rows, ceil(H/64), 2)``, ``w_scale (e, ceil(H/64), N, 2)``
(``mm_weight_scale (ceil(H2/64), N2, 2)``); scale ``[.., g, .., p]`` multiplies K indices
``64 g + 32 p .. +31``. In ``npu_alltoallv_quant_gmm`` the row scales travel with their rows
through the AlltoAllv and Permute. ``permute_out`` keeps ``gmm_x``'s dtype.

Not emulated (NotImplementedError): T-T mode (quant mode 1; documented only for hifloat8 inputs,
``*_dtype=torch_npu.hifloat8``, not read in this pass), float4 / hifloat8 ``*_dtype`` arguments,
other group sizes, ``send_counts_tensor``/``recv_counts_tensor`` ("only None"), ``comm_quant_scale``
/ ``comm_quant_dtype`` ("not supported yet"), ``comm_quant_mode`` other than 0, ``comm_mode``.
Outputs the real op leaves undefined are empty ``(0,)`` tensors, as in ``comm/alltoallv_gmm.py``.
"""
import torch

from torch_npu.op_plugin._common import check, unsupported
from torch_npu.op_plugin._opaque_vjp import non_differentiable
from torch_npu.op_plugin._registry import opaque_kernel
from torch_npu.op_plugin.comm.alltoallv_gmm import _alltoallv, _expert_major, _rank_major
from torch_npu.op_plugin.comm.matmul_collectives import _world
from torch_npu.op_plugin.quant.quantize import _dtype_arg
from torch_npu.op_plugin.quant.transpose_quant_matmul import _e8m0_values

__all__ = []

_FLOAT8 = (torch.float8_e4m3fn, torch.float8_e5m2)
_MX_GROUP = 32


def _rows_scale(scale, k):
    """(R, ceil(K/64), 2) e8m0 -> (R, K) float32."""
    s = _e8m0_values(scale).reshape(scale.shape[0], -1)
    return s.repeat_interleave(_MX_GROUP, dim=-1)[:, :k]


def _cols_scale(scale, k):
    """(..., ceil(K/64), N, 2) e8m0 -> (..., K, N) float32."""
    s = _e8m0_values(scale).movedim(-1, -2)                    # (..., G, 2, N)
    s = s.reshape(s.shape[:-3] + (-1, s.shape[-1]))
    return s.repeat_interleave(_MX_GROUP, dim=-2)[..., :k, :]


def _check_unsupported(op, pairs):
    for name, value in pairs:
        if value is not None:
            unsupported(op, name)


def _check_mx(op, modes, group_size, scales):
    for name, mode in modes:
        if mode not in (None, 6):
            raise NotImplementedError("%s: %s=%r is not emulated (only MX mode 6; T-T mode 1 needs hifloat8)"
                                      % (op, name, mode))
    if group_size is not None and list(group_size) not in ([0, 0, 0], [1, 1, 32]):
        raise NotImplementedError("%s: group_size=%s is not supported (MX uses [1, 1, 32])" % (op, list(group_size)))
    for name, s in scales:
        if s is not None and s.dtype != torch.float8_e8m0fnu:
            raise NotImplementedError("%s: %s of dtype %s is not emulated (MX scales are float8_e8m0fnu)"
                                      % (op, name, s.dtype))


def _check_gmm(op, gmm_x, gmm_weight, gmm_x_scale, gmm_weight_scale, world, send_counts, recv_counts):
    check(gmm_x.dim() == 2 and gmm_weight.dim() == 3, op, "gmm_x must be 2D and gmm_weight 3D (e, H1, N1)")
    check(gmm_x.dtype in _FLOAT8 and gmm_weight.dtype in _FLOAT8, op,
          "gmm_x and gmm_weight must be float8_e4m3fn/float8_e5m2, got %s and %s", (gmm_x.dtype, gmm_weight.dtype))
    e, h1, n1 = gmm_weight.shape
    check(gmm_x.shape[1] == h1, op, "H1 of gmm_x and gmm_weight differ")
    g = (h1 + 63) // 64
    check(tuple(gmm_x_scale.shape) == (gmm_x.shape[0], g, 2), op, "gmm_x_scale must be (%d, %d, 2), got %s",
          (gmm_x.shape[0], g, tuple(gmm_x_scale.shape)))
    check(tuple(gmm_weight_scale.shape) == (e, g, n1, 2), op, "gmm_weight_scale must be %s, got %s",
          ((e, g, n1, 2), tuple(gmm_weight_scale.shape)))
    check(len(send_counts) == len(recv_counts) == e * world, op,
          "send_counts and recv_counts must have e * ep_world_size = %d entries", (e * world))
    check(sum(send_counts) == gmm_x.shape[0], op, "gmm_x has %d rows, send_counts sum to %d",
          (gmm_x.shape[0], sum(send_counts)))
    return e


def _grouped_mx(rows, rows_scale, weight, weight_scale, sizes, dtype):
    k = rows.shape[1]
    a = rows.float() * _rows_scale(rows_scale, k)
    w = weight.float() * _cols_scale(weight_scale, k)
    parts = torch.split(a, sizes)
    return torch.cat([part @ w[j] for j, part in enumerate(parts)]).to(dtype)


def _shared_mx(op, mm_x, mm_weight, mm_x_scale, mm_weight_scale, mm_y_dtype, gmm_y_dtype, like):
    if mm_x is None and mm_weight is None:
        return like.new_empty((0,), dtype=gmm_y_dtype)
    check(mm_x is not None and mm_weight is not None and mm_x_scale is not None and mm_weight_scale is not None, op,
          "mm_x, mm_weight, mm_x_scale and mm_weight_scale must be given together")
    check(mm_y_dtype is not None, op, "mm_y_dtype is required with mm_x/mm_weight")
    out = _dtype_arg(op, "mm_y_dtype", mm_y_dtype, (torch.float16, torch.bfloat16))
    check(out == gmm_y_dtype, op, "mm_y_dtype must equal gmm_y_dtype")
    check(mm_x.dtype in _FLOAT8 and mm_weight.dtype in _FLOAT8 and mm_x.dim() == 2 and mm_weight.dim() == 2, op,
          "mm_x and mm_weight must be 2-d float8")
    h2, n2 = mm_weight.shape
    check(mm_x.shape[1] == h2, op, "H2 of mm_x and mm_weight differ")
    g = (h2 + 63) // 64
    check(tuple(mm_x_scale.shape) == (mm_x.shape[0], g, 2) and tuple(mm_weight_scale.shape) == (g, n2, 2), op,
          "mm_x_scale must be (BS, ceil(H2/64), 2) and mm_weight_scale (ceil(H2/64), N2, 2)")
    a = mm_x.float() * _rows_scale(mm_x_scale, h2)
    w = mm_weight.float() * _cols_scale(mm_weight_scale, h2)
    return (a @ w).to(out)


def _npu_alltoallv_quant_gmm(shapes_only, gmm_x, gmm_weight, gmm_x_scale, gmm_weight_scale, hcom, ep_world_size,
                             send_counts, recv_counts, gmm_y_dtype, *, send_counts_tensor=None, recv_counts_tensor=None,
                             mm_x=None, mm_weight=None, mm_x_scale=None, mm_weight_scale=None, gmm_x_quant_mode=None,
                             gmm_weight_quant_mode=None, mm_x_quant_mode=None, mm_weight_quant_mode=None,
                             permute_out_flag=False, group_size=None, gmm_x_dtype=None, gmm_weight_dtype=None,
                             gmm_x_scale_dtype=None, gmm_weight_scale_dtype=None, mm_x_dtype=None, mm_weight_dtype=None,
                             mm_x_scale_dtype=None, mm_weight_scale_dtype=None, mm_y_dtype=None, comm_mode=None):
    """See the module doc."""
    op = "npu_alltoallv_quant_gmm"
    _check_unsupported(op, (("send_counts_tensor", send_counts_tensor), ("recv_counts_tensor", recv_counts_tensor),
                            ("gmm_x_dtype", gmm_x_dtype), ("gmm_weight_dtype", gmm_weight_dtype),
                            ("gmm_x_scale_dtype", gmm_x_scale_dtype), ("gmm_weight_scale_dtype", gmm_weight_scale_dtype),
                            ("mm_x_dtype", mm_x_dtype), ("mm_weight_dtype", mm_weight_dtype),
                            ("mm_x_scale_dtype", mm_x_scale_dtype), ("mm_weight_scale_dtype", mm_weight_scale_dtype),
                            ("comm_mode", comm_mode)))
    _check_mx(op, (("gmm_x_quant_mode", gmm_x_quant_mode), ("gmm_weight_quant_mode", gmm_weight_quant_mode),
                   ("mm_x_quant_mode", mm_x_quant_mode), ("mm_weight_quant_mode", mm_weight_quant_mode)), group_size,
              (("gmm_x_scale", gmm_x_scale), ("gmm_weight_scale", gmm_weight_scale), ("mm_x_scale", mm_x_scale),
               ("mm_weight_scale", mm_weight_scale)))
    out_dtype = _dtype_arg(op, "gmm_y_dtype", gmm_y_dtype, (torch.float16, torch.bfloat16))
    send_counts, recv_counts = [int(c) for c in send_counts], [int(c) for c in recv_counts]
    e = _check_gmm(op, gmm_x, gmm_weight, gmm_x_scale, gmm_weight_scale, ep_world_size, send_counts, recv_counts)
    mm_y = _shared_mx(op, mm_x, mm_weight, mm_x_scale, mm_weight_scale, mm_y_dtype, out_dtype, gmm_x)
    a = sum(recv_counts)
    if shapes_only:  # the fake kernel: shapes only, no exchange
        permute = gmm_x.new_empty((a, gmm_x.shape[1]))
        gmm_y = gmm_x.new_empty((a, gmm_weight.shape[2]), dtype=out_dtype)
    else:
        group = _world(op, hcom, ep_world_size)
        # float8 payloads travel as bytes; each row's scales travel with it
        received = _alltoallv(gmm_x.view(torch.uint8), group, send_counts, recv_counts, ep_world_size, e)
        received_scale = _alltoallv(gmm_x_scale.view(torch.uint8), group, send_counts, recv_counts, ep_world_size, e)
        index, sizes = _expert_major(recv_counts, ep_world_size, e, gmm_x.device)
        permute = received.index_select(0, index).view(gmm_x.dtype)
        permute_scale = received_scale.index_select(0, index).view(torch.float8_e8m0fnu)
        gmm_y = _grouped_mx(permute, permute_scale, gmm_weight, gmm_weight_scale, sizes, out_dtype)
    return gmm_y, mm_y, permute if permute_out_flag else gmm_x.new_empty((0,))


def _npu_quant_gmm_alltoallv(shapes_only, gmm_x, gmm_weight, gmm_x_scale, gmm_weight_scale, hcom, ep_world_size,
                             send_counts, recv_counts, gmm_y_dtype, *, send_counts_tensor=None, recv_counts_tensor=None,
                             mm_x=None, mm_weight=None, mm_x_scale=None, mm_weight_scale=None, comm_quant_scale=None,
                             gmm_x_quant_mode=None, gmm_weight_quant_mode=None, mm_x_quant_mode=None,
                             mm_weight_quant_mode=None, comm_quant_mode=None, group_size=None, gmm_x_dtype=None,
                             gmm_weight_dtype=None, gmm_x_scale_dtype=None, gmm_weight_scale_dtype=None,
                             mm_x_dtype=None, mm_weight_dtype=None, mm_x_scale_dtype=None, mm_weight_scale_dtype=None,
                             comm_quant_dtype=None, mm_y_dtype=None, comm_mode=None):
    """See the module doc."""
    op = "npu_quant_gmm_alltoallv"
    _check_unsupported(op, (("send_counts_tensor", send_counts_tensor), ("recv_counts_tensor", recv_counts_tensor),
                            ("comm_quant_scale", comm_quant_scale), ("comm_quant_dtype", comm_quant_dtype),
                            ("gmm_x_dtype", gmm_x_dtype), ("gmm_weight_dtype", gmm_weight_dtype),
                            ("gmm_x_scale_dtype", gmm_x_scale_dtype), ("gmm_weight_scale_dtype", gmm_weight_scale_dtype),
                            ("mm_x_dtype", mm_x_dtype), ("mm_weight_dtype", mm_weight_dtype),
                            ("mm_x_scale_dtype", mm_x_scale_dtype), ("mm_weight_scale_dtype", mm_weight_scale_dtype),
                            ("comm_mode", comm_mode)))
    if comm_quant_mode not in (None, 0):
        raise NotImplementedError("%s: comm_quant_mode=%r is not supported (only 0)" % (op, comm_quant_mode))
    _check_mx(op, (("gmm_x_quant_mode", gmm_x_quant_mode), ("gmm_weight_quant_mode", gmm_weight_quant_mode),
                   ("mm_x_quant_mode", mm_x_quant_mode), ("mm_weight_quant_mode", mm_weight_quant_mode)), group_size,
              (("gmm_x_scale", gmm_x_scale), ("gmm_weight_scale", gmm_weight_scale), ("mm_x_scale", mm_x_scale),
               ("mm_weight_scale", mm_weight_scale)))
    out_dtype = _dtype_arg(op, "gmm_y_dtype", gmm_y_dtype, (torch.float16, torch.bfloat16))
    send_counts, recv_counts = [int(c) for c in send_counts], [int(c) for c in recv_counts]
    e = _check_gmm(op, gmm_x, gmm_weight, gmm_x_scale, gmm_weight_scale, ep_world_size, send_counts, recv_counts)
    mm_y = _shared_mx(op, mm_x, mm_weight, mm_x_scale, mm_weight_scale, mm_y_dtype, out_dtype, gmm_x)
    if shapes_only:  # the fake kernel: shapes only, no exchange
        return gmm_x.new_empty((sum(recv_counts), gmm_weight.shape[2]), dtype=out_dtype), mm_y
    world = ep_world_size
    group = _world(op, hcom, world)
    sizes, index = _rank_major(send_counts, world, e, gmm_x.device)
    gmm_y = _grouped_mx(gmm_x, gmm_x_scale, gmm_weight, gmm_weight_scale, sizes, out_dtype)
    return _alltoallv(gmm_y.index_select(0, index), group, send_counts, recv_counts, world, e), mm_y


# Registered opaque, as npu_alltoallv_gmm (comm/alltoallv_gmm.py): the exchange needs real
# tensors; the fake kernel gives the shapes. float8 inputs carry no gradient.
npu_alltoallv_quant_gmm = opaque_kernel("npu_alltoallv_quant_gmm", _npu_alltoallv_quant_gmm)
npu_quant_gmm_alltoallv = opaque_kernel("npu_quant_gmm_alltoallv", _npu_quant_gmm_alltoallv)


non_differentiable("npu_alltoallv_quant_gmm", "npu_quant_gmm_alltoallv")
