"""Random number generation of torch.npu.

Each device has its own default generator, independent of the CPU one. Its
state is 16 bytes, ``[seed: uint64 | offset: int64]``, as in torch_npu: the
numbers an op draws depend only on (seed, offset), and each random op
advances the offset.
"""
from typing import Iterable, List, Union

import torch

import torch_npu

__all__ = ["get_rng_state", "get_rng_state_all", "set_rng_state", "set_rng_state_all", "manual_seed",
           "manual_seed_all", "seed", "seed_all", "initial_seed"]


def _device_index(device):
    if isinstance(device, str):
        device = torch.device(device)
    elif isinstance(device, int):
        device = torch.device("npu", device)
    idx = device.index
    if idx is None:
        idx = torch_npu.npu.current_device()
    return idx


def _generator(idx):
    gens = torch_npu.npu.default_generators
    if idx < 0 or idx >= len(gens):
        raise RuntimeError(f"Invalid device_index : {idx}")
    return gens[idx]


def get_rng_state(device: Union[int, str, torch.device] = "npu") -> torch.Tensor:
    r"""Return the random number generator state of the given NPU as a ByteTensor."""
    torch_npu.npu._lazy_init()
    return _generator(_device_index(device)).get_state()


def get_rng_state_all() -> List[torch.Tensor]:
    return [get_rng_state(i) for i in range(torch_npu.npu.device_count())]


def set_rng_state(new_state: torch.Tensor, device: Union[int, str, torch.device] = "npu") -> None:
    r"""Set the random number generator state of the given NPU."""
    new_state_copy = new_state.clone(memory_format=torch.contiguous_format)

    def cb():
        _generator(_device_index(device)).set_state(new_state_copy)

    torch_npu.npu._lazy_call(cb)


def set_rng_state_all(new_states: Iterable[torch.Tensor]) -> None:
    for i, state in enumerate(new_states):
        set_rng_state(state, i)


def manual_seed(seed: int) -> None:
    r"""Set the seed for generating random numbers on the current NPU."""
    seed = int(seed)

    def cb():
        _generator(torch_npu.npu.current_device()).manual_seed(seed)

    torch_npu.npu._lazy_call(cb)


def manual_seed_all(seed: int) -> None:
    r"""Set the seed for generating random numbers on all NPUs."""
    seed = int(seed)

    def cb():
        for g in torch_npu.npu.default_generators:
            g.manual_seed(seed)

    torch_npu.npu._lazy_call(cb)


def seed() -> None:
    r"""Set the seed of the current NPU to a random number."""
    def cb():
        _generator(torch_npu.npu.current_device()).seed()

    torch_npu.npu._lazy_call(cb)


def seed_all() -> None:
    r"""Set the seed of all NPUs to one random number."""
    def cb():
        random_seed = 0
        seeded = False
        for g in torch_npu.npu.default_generators:
            if not seeded:
                g.seed()
                random_seed = g.initial_seed()
                seeded = True
            else:
                g.manual_seed(random_seed)

    torch_npu.npu._lazy_call(cb)


def initial_seed() -> int:
    r"""Return the current random seed of the current NPU."""
    torch_npu.npu._lazy_init()
    return _generator(torch_npu.npu.current_device()).initial_seed()
