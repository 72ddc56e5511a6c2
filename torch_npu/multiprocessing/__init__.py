"""``torch_npu.multiprocessing``: npu tensors and events across processes (torch.multiprocessing queues, pipes)."""
from torch_npu.multiprocessing import reductions

# torch_npu's start-up sequence installs the reductions (reductions._install).

__all__ = []
