"""``cache_compile`` / ``readable_cache``: compile once, keep what was compiled on disk.

On hardware ``cache_compile`` serialises the compiled aclgraph so a restarted
process skips dynamo. Here the compiled code is cached by Inductor's own FX
graph cache; ``cache_compile`` also writes, after each new compilation, a
readable record ``<cache_dir>/<function>/<ranks>/compiled_graphs.txt`` (one
entry per compiled graph: its FX code), which ``readable_cache`` prints. The
record's format is the emulator's own, not the hardware cache binary.
"""
import functools
import os

import torch

__all__ = ["cache_compile", "readable_cache"]

_RECORD = "compiled_graphs.txt"


def _record_dir(func, cache_dir, global_rank, tp_rank, pp_rank):
    name = getattr(func, "__qualname__", type(func).__name__).replace("<", "").replace(">", "")
    ranks = f"world{global_rank or 0}_tp{tp_rank or 0}_pp{pp_rank or 0}"
    return os.path.join(cache_dir or ".torchair_cache", name, ranks)


def cache_compile(func, *, dynamic: bool = True, cache_dir=None, global_rank=None, tp_rank=None, pp_rank=None,
                  **kwargs):
    """``func`` compiled with the npugraph_ex backend; each compiled graph is recorded under ``cache_dir``."""
    from torch_npu.npu.npugraph_ex import compile_fx
    folder = _record_dir(func, cache_dir, global_rank, tp_rank, pp_rank)

    def backend(gm, example_inputs):
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, _RECORD), "a", encoding="utf-8") as f:
            f.write(f"# graph {gm.__class__.__name__}\n{gm.code.strip()}\n\n")
        return compile_fx(gm, example_inputs, kwargs.get("options"))

    compiled = torch.compile(func, backend=backend, dynamic=dynamic)
    functools.update_wrapper(compiled, func)
    compiled.cache_bin = os.path.join(folder, _RECORD)
    return compiled


def readable_cache(cache_bin, print_output=True, file=None):
    """The text of a cache record written by ``cache_compile``; printed, and written to ``file`` if given."""
    if not os.path.isfile(cache_bin):
        raise FileNotFoundError(f"cache file {cache_bin} does not exist")
    with open(cache_bin, encoding="utf-8") as f:
        text = f.read()
    if print_output:
        print(text)
    if file is not None:
        with open(file, "w", encoding="utf-8") as f:
            f.write(text)
    return text
