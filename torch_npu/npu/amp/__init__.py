from .autocast_mode import autocast, custom_fwd, custom_bwd  # noqa: F401
from .grad_scaler import GradScaler  # noqa: F401
from . import sharded_grad_scaler  # noqa: F401

__all__ = ["autocast", "GradScaler", "custom_fwd", "custom_bwd"]
