"""``torch.npu.amp.autocast`` and ``custom_fwd``/``custom_bwd`` (mirror of torch.cuda.amp)."""
import functools

import torch

__all__ = ["autocast", "custom_fwd", "custom_bwd"]


class autocast(torch.amp.autocast_mode.autocast):
    r"""``torch.npu.amp.autocast(args...)`` is equivalent to ``torch.autocast("npu", args...)``.

    Usable both as a context manager and as a decorator.
    """

    def __init__(self, enabled: bool = True, dtype: torch.dtype = torch.float16, cache_enabled: bool = True):
        if torch._jit_internal.is_scripting():
            self._enabled = enabled
            self.device = "npu"
            self.fast_dtype = dtype
            return
        super().__init__("npu", enabled=enabled, dtype=dtype, cache_enabled=cache_enabled)

    def __enter__(self):
        if torch._jit_internal.is_scripting():
            return self
        return super().__enter__()

    def __exit__(self, exc_type, exc_val, exc_tb):
        if torch._jit_internal.is_scripting():
            return
        return super().__exit__(exc_type, exc_val, exc_tb)

    def __call__(self, func):
        if torch._jit_internal.is_scripting():
            return func
        return super().__call__(func)


def custom_fwd(fwd=None, *, cast_inputs=None):
    r"""``torch.amp.custom_fwd(fwd, device_type="npu", cast_inputs=...)``."""
    if fwd is None:
        return functools.partial(custom_fwd, cast_inputs=cast_inputs)
    return torch.amp.custom_fwd(fwd, device_type="npu", cast_inputs=cast_inputs)


def custom_bwd(bwd):
    r"""``torch.amp.custom_bwd(bwd, device_type="npu")``."""
    return torch.amp.custom_bwd(bwd, device_type="npu")
