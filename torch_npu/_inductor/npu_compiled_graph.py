"""Runs an Inductor CPU kernel on npu tensors: the runtime half of "compile as CPU".

Inputs are replaced by zero-copy CPU aliases, the compiled CPU code runs with
its allocations served from the npu device pool, and outputs come back as npu
tensors: views of an npu input become views of that input, everything else is
adopted by the device. Graphs with random ops draw their seed from the npu
generator, so ``torch.npu.manual_seed`` makes compiled dropout reproducible.
"""
from typing import Any, Callable, List, Sequence

import torch

from torch_npu._inductor import cpu_alias
from torch_npu._inductor.rng import npu_seeded_cpu_rng


class NpuCompiledGraph:
    """A boxed callable (Inductor/AOTAutograd calling convention: one list)."""

    def __init__(self, cpu_compiled: Callable, device_index: int, npu_outputs: Sequence[bool],
                 has_random: bool):
        # An instance attribute: wrappers (torch._dynamo.disable) copy __dict__ only.
        self._boxed_call = True
        self.cpu_compiled = cpu_compiled
        self.device_index = device_index
        # Per graph output: True where the traced graph produced an npu tensor.
        self.npu_outputs = list(npu_outputs)
        self.has_random = has_random
        # Attributes AOTAutograd reads from an OutputCode, passed through.
        for name in ("_fx_graph_cache_key", "_time_taken_ns"):
            if hasattr(cpu_compiled, name):
                setattr(self, name, getattr(cpu_compiled, name))

    def __call__(self, args: List[Any]) -> List[Any]:
        npu_by_storage = {}
        # The aliases do not own memory: the npu inputs stay referenced until
        # the CPU code has returned.
        held = [a for a in args if isinstance(a, torch.Tensor)]
        cpu_args = []
        for a in args:
            if isinstance(a, torch.Tensor) and a.device.type == "npu":
                npu_by_storage.setdefault(a.untyped_storage().data_ptr(), a)
                cpu_args.append(cpu_alias.cpu_alias(a))
            else:
                cpu_args.append(a)
        args.clear()  # boxed convention: the callee owns (and may free) the inputs
        with cpu_alias.device_memory_scope(self.device_index):
            if self.has_random:
                with npu_seeded_cpu_rng(self.device_index):
                    outs = _call(self.cpu_compiled, cpu_args)
            else:
                outs = _call(self.cpu_compiled, cpu_args)
        result = self._to_npu(outs, npu_by_storage)
        del held
        return result

    def _to_npu(self, outs, npu_by_storage):
        device = torch.device("npu", self.device_index)
        # Count outputs per storage: a storage shared by several outputs must be
        # adopted once and viewed by each of them.
        shared = {}
        for o in outs:
            if isinstance(o, torch.Tensor) and o.device.type == "cpu":
                key = o.untyped_storage().data_ptr()
                shared[key] = shared.get(key, 0) + 1
        adopted = {}
        result = []
        for i, o in enumerate(outs):
            if not (isinstance(o, torch.Tensor) and o.device.type == "cpu"):
                result.append(o)
                continue
            if i < len(self.npu_outputs) and not self.npu_outputs[i]:
                # The traced program itself returned a CPU tensor here; give it
                # memory of its own rather than a block of the device pool.
                result.append(o.clone() if o.untyped_storage().data_ptr() in npu_by_storage
                              or cpu_alias.is_zero_copy() else o)
                continue
            storage = o.untyped_storage()
            key = storage.data_ptr()
            if storage.nbytes() == 0:
                result.append(torch.empty_strided(o.size(), o.stride(), dtype=o.dtype, device=device))
                continue
            base = npu_by_storage.get(key)
            if base is None and shared[key] == 1 and _covers_storage(o):
                result.append(cpu_alias.adopt(o, self.device_index))
                continue
            if base is None:
                npu_storage = adopted.get(key)
                if npu_storage is None:
                    whole = torch.empty(0, dtype=torch.uint8).set_(storage)
                    npu_storage = cpu_alias.adopt(whole, self.device_index).untyped_storage()
                    adopted[key] = npu_storage
            else:
                npu_storage = base.untyped_storage()
            view = torch.empty(0, dtype=o.dtype, device=device)
            view.set_(npu_storage, o.storage_offset(), o.size(), o.stride())
            result.append(view)
        return result


def _covers_storage(t: torch.Tensor) -> bool:
    return t.storage_offset() == 0 and t.is_contiguous() and \
        t.numel() * t.element_size() == t.untyped_storage().nbytes()


def _call(fn, args):
    if getattr(fn, "_boxed_call", False):
        return fn(args)
    return fn(*args)
