"""Autocast queries of torch.npu (torch.autocast("npu") asks for these)."""
import torch

__all__ = ["get_amp_supported_dtype", "is_autocast_enabled", "set_autocast_enabled", "get_autocast_dtype",
           "set_autocast_dtype"]


def get_amp_supported_dtype():
    return [torch.float16, torch.bfloat16, torch.float32]


def is_autocast_enabled():
    return torch.is_autocast_enabled("npu")


def set_autocast_enabled(enable):
    torch.set_autocast_enabled("npu", enable)


def get_autocast_dtype():
    return torch.get_autocast_dtype("npu")


def set_autocast_dtype(dtype):
    torch.set_autocast_dtype("npu", dtype)
