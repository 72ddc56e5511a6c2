"""``torch.nn.attention.flex_attention`` accepts npu tensors.

Stock PyTorch checks flex attention inputs against a list of device types
that does not name npu; like the real torch_npu, npu inputs are let through
(they only have to share one device), and every other device keeps PyTorch's
own check. Applied when the flex attention module is first imported.
"""
import sys

__all__ = []

_MODULE = "torch.nn.attention.flex_attention"


def _patch_flex_attention_device():
    """Make flex attention's device check accept npu tensors. Idempotent."""
    fa_mod = sys.modules.get(_MODULE)
    if fa_mod is None or getattr(fa_mod, "_npu_device_patched", False):
        return
    stock_check = fa_mod._validate_device

    def _validate_device(query, key, value):
        if query.device.type != "npu":
            return stock_check(query, key, value)
        if query.device != key.device or query.device != value.device:
            raise ValueError(
                f"Expected query, key, and value to have the same device, "
                f"but got query.device: {query.device}, key.device: {key.device}, "
                f"and value.device: {value.device} instead.")
        return None

    fa_mod._validate_device = _validate_device
    fa_mod._npu_device_patched = True


def _install():
    """Patch now if flex attention is loaded, else right after its import."""
    if _MODULE in sys.modules:
        _patch_flex_attention_device()
        return
    from torch_npu.dynamo import _AfterImport
    sys.meta_path.insert(0, _AfterImport(_MODULE, _patch_flex_attention_device))
