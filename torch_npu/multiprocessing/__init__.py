"""``torch_npu.multiprocessing``: npu tensors and events across processes (torch.multiprocessing queues, pipes)."""
from torch_npu.multiprocessing import reductions

reductions._install()

__all__ = []
