"""``torch.npu.aclnn.backends``: the aclnn library version."""

__all__ = ["version"]


def version():
    r"""The aclnn library version; None, as on torch_npu builds that do not expose it
    (and there is no aclnn library behind the emulated device)."""
    return None
