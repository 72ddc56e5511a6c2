"""Combine many tensors into one flat buffer (each tensor becomes a view of it),
so one kernel can update them all: ``npu_combine_tensors`` and its checks."""
import torch

from torch_npu.utils._error_code import ErrCode, pta_error

__all__ = ["npu_combine_tensors", "get_part_combined_tensor", "is_combined_tensor_valid"]


def npu_combine_tensors(list_of_tensor, require_copy_value=True):
    r"""Return one 1-D tensor holding all tensors back to back; each input's
    ``.data`` becomes a view into it (values copied when ``require_copy_value``)."""
    if not list_of_tensor:
        return None
    first = list_of_tensor[0]
    for t in list_of_tensor:
        if t.dtype != first.dtype or t.device != first.device:
            raise RuntimeError("Tensors to combine must have the same dtype and device."
                               + pta_error(ErrCode.PARAM))
    total = sum(t.numel() for t in list_of_tensor)
    combined = torch.zeros(total, dtype=first.dtype, device=first.device)
    offset = 0
    for t in list_of_tensor:
        n = t.numel()
        part = combined[offset:offset + n]
        if require_copy_value:
            part.copy_(t.detach().reshape(-1))
        t.data = part.view(t.shape)
        offset += n
    return combined


def get_part_combined_tensor(combined_tensor, index, size):
    if combined_tensor is None or index + size > combined_tensor.numel():
        raise RuntimeError("index and size are out of the range of combined_tensor." + pta_error(ErrCode.VALUE))
    return combined_tensor[index:index + size]


def is_combined_tensor_valid(combined_tensor, list_of_tensor):
    r"""True when the tensors are, in order, consecutive views of ``combined_tensor``."""
    if combined_tensor is None or not list_of_tensor:
        return False
    base = combined_tensor.data_ptr()
    item = combined_tensor.element_size()
    offset = 0
    for t in list_of_tensor:
        if t.data_ptr() != base + offset * item or t.untyped_storage().data_ptr() != \
                combined_tensor.untyped_storage().data_ptr():
            return False
        offset += t.numel()
    return offset <= combined_tensor.numel()
