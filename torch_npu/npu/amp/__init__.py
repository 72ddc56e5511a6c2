from .autocast_mode import autocast, custom_fwd, custom_bwd  # noqa: F401
from .grad_scaler import GradScaler  # noqa: F401

__all__ = ["autocast", "GradScaler", "custom_fwd", "custom_bwd"]


def __getattr__(name):
    # sharded_grad_scaler imports FSDP (about 3 s): loaded on first access only.
    if name == "sharded_grad_scaler":
        import importlib
        return importlib.import_module(f"{__name__}.sharded_grad_scaler")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
