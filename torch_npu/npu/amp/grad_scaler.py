"""``torch.npu.amp.GradScaler``: ``torch.amp.GradScaler`` on "npu" plus the NPU-only
``dynamic`` argument.

``dynamic=True`` (default) is ordinary dynamic loss scaling.  ``dynamic=False`` is static
loss scaling: steps whose gradients contain inf/NaN are still skipped, but ``update()``
(without ``new_scale``) never changes the scale nor the growth tracker.  An explicit
``update(new_scale)`` still sets the scale.
"""
import warnings
from collections import defaultdict

import torch
from torch.amp.grad_scaler import _refresh_per_optimizer_state

import torch_npu
from torch_npu.npu._overflow import get_npu_overflow_flag as _get_flag
from torch_npu.npu._overflow import clear_npu_overflow_flag as _clear_flag

__all__ = ["GradScaler"]


class GradScaler(torch.amp.GradScaler):
    def __init__(self, init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5,
                 growth_interval=2000, dynamic=True, enabled=True):
        if enabled and not torch_npu.npu.is_available():
            warnings.warn("torch_npu.amp.GradScaler is enabled, but NPU is not available.  Disabling.")
            enabled = False
        super().__init__("npu", init_scale=init_scale, growth_factor=growth_factor,
                         backoff_factor=backoff_factor, growth_interval=growth_interval, enabled=enabled)
        self._dynamic = dynamic

    @staticmethod
    def get_npu_overflow_flag():
        return _get_flag()

    @staticmethod
    def clear_npu_overflow_flag():
        return _clear_flag()

    def scale(self, outputs):
        return super().scale(outputs)

    def unscale_(self, optimizer):
        return super().unscale_(optimizer)

    def step(self, optimizer, *args, **kwargs):
        return super().step(optimizer, *args, **kwargs)

    def update(self, new_scale=None):
        if not self._enabled:
            return
        if new_scale is None and not self._dynamic:
            # Static loss scaling: keep scale and growth tracker, just reset per-iteration state.
            self._check_scale_growth_tracker("update")
            self._per_optimizer_states = defaultdict(_refresh_per_optimizer_state)
            return
        return super().update(new_scale)

    def state_dict(self):
        state = super().state_dict()
        if self._enabled:
            state["dynamic"] = self._dynamic
        return state

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        if "dynamic" in state_dict:
            self._dynamic = state_dict["dynamic"]
