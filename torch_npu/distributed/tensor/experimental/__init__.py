from ._context_parallel import context_parallel  # noqa: F401

__all__ = ["context_parallel"]
