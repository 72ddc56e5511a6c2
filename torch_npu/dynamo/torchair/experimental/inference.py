"""``use_internal_format_weight`` / ``npu_format_cast_via_cpu``: weight format helpers."""
__all__ = ["use_internal_format_weight", "npu_format_cast_via_cpu"]


def use_internal_format_weight(model):
    """NPU private weight formats do not exist on the emulated device: a no-op."""
    return model


def npu_format_cast_via_cpu(self, acl_format: int, customize_dtype=None, input_dtype=None):
    """``torch_npu.npu_format_cast`` done through host memory on hardware;
    the emulated device casts in place of it with the same result."""
    import torch_npu
    return torch_npu.npu_format_cast(self, acl_format, customize_dtype=customize_dtype, input_dtype=input_dtype)
