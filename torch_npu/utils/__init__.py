"""torch_npu.utils: helpers shared by the package (grown by later layers)."""
from torch_npu.utils.serialization import save_async
from torch_npu.utils import serialization as _serialization

# As in the real torch_npu, torch.load becomes torch_npu.utils.serialization.load.
_serialization._install()

from torch_npu.utils.combine_tensors import npu_combine_tensors, get_part_combined_tensor, is_combined_tensor_valid
from torch_npu.utils.flops_count import FlopsCounter
from torch_npu.utils.affinity import set_thread_affinity, reset_thread_affinity
from torch_npu.utils import _cann, _logging
from torch_npu.utils import syncbatchnorm as _syncbatchnorm

_syncbatchnorm._install()  # torch.nn.SyncBatchNorm on npu tensors
from torch_npu.utils import _data_parallel

_data_parallel._install()  # torch.nn.DataParallel: one npu device works, several raise naming DDP/torch_npu_run
from torch_npu.utils import _rnn_decompositions

_rnn_decompositions._install()  # torch.compile traces npu RNNs through torch's decompositions

_logging.configure()


def get_cann_version(module="CANN"):
    r"""Version of a CANN package (``CANN``, ``RUNTIME``, ``COMPILER``, ``HCCL``,
    ``TOOLKIT``, ``OPP``, ``OPP_KERNEL``, ``DRIVER``): the emulated machine's."""
    return _cann.get_cann_version(module)


__all__ = ["npu_combine_tensors", "get_part_combined_tensor", "is_combined_tensor_valid", "FlopsCounter",
           "set_thread_affinity", "reset_thread_affinity", "save_async", "get_cann_version"]
