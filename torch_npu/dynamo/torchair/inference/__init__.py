"""torchair.inference: ``cache_compile``, ``readable_cache``, ``set_dim_gears``, ``get_dim_gears``.

``cache_compile``/``readable_cache`` are npugraph_ex's (one implementation,
see ``torch_npu.npu.npugraph_ex.inference``).
"""
from torch_npu.npu.npugraph_ex.inference import cache_compile, readable_cache

__all__ = ["cache_compile", "readable_cache", "set_dim_gears"]


def set_dim_gears(t, dim_gears):
    """Declare the sizes (gears) dimension ``dim`` of ``t`` takes: ``{dim: [size, ...]}``.

    Each listed dimension is marked dynamic for dynamo. On hardware GE then
    builds one graph per gear and rejects other sizes; the emulated backend
    compiles one dynamic graph, so sizes outside the gears are not rejected.
    """
    import torch
    if any(len(gears) < 2 for gears in dim_gears.values()):
        raise AssertionError(f'The gears size at least 2, but config gears is {dim_gears}')
    for dim in dim_gears:
        torch._dynamo.mark_dynamic(t, dim)
    t.dim_gears = dim_gears


def get_dim_gears(t):
    """The gears ``set_dim_gears`` gave ``t``, or None."""
    return getattr(t, "dim_gears", None)
