"""Random ops in compiled graphs draw from the npu generator.

Inductor's CPU code seeds its random kernels from the CPU default generator.
Around a compiled npu graph that has random ops, that generator is seeded from
the npu generator (advancing it, as an eager random op would) and restored
afterwards, so compiled dropout follows ``torch.npu.manual_seed`` and leaves
the CPU random stream untouched.
"""
import contextlib

import torch

_SEED_BOUND = 2 ** 62


@contextlib.contextmanager
def npu_seeded_cpu_rng(device_index: int):
    seed = int(torch.randint(0, _SEED_BOUND, (), device=torch.device("npu", device_index)).item())
    cpu_gen = torch.default_generator
    saved = cpu_gen.get_state()
    cpu_gen.manual_seed(seed)
    try:
        yield
    finally:
        cpu_gen.set_state(saved)


def graph_has_random_ops(gm: torch.fx.GraphModule) -> bool:
    """True if any node of the (ATen-level) graph draws random numbers."""
    for node in gm.graph.nodes:
        if node.op == "call_function":
            tags = getattr(node.target, "tags", ())
            if torch.Tag.nondeterministic_seeded in tags:
                return True
    return False
