"""torch_npu.utils: helpers shared by the package.

Importing it changes nothing outside torch_npu: the patches of PyTorch that
live here are applied by :func:`_install_patches`, which ``torch_npu``'s
start-up sequence calls.
"""
from torch_npu.utils.serialization import save_async
from torch_npu.utils.combine_tensors import npu_combine_tensors, get_part_combined_tensor, is_combined_tensor_valid
from torch_npu.utils.flops_count import FlopsCounter
from torch_npu.utils.affinity import set_thread_affinity, reset_thread_affinity
from torch_npu.utils import _cann, _cann_env  # noqa: F401
from torch_npu.utils import storage  # noqa: F401  (torch_npu.utils.storage, as in the real package)


def _install_patches():
    """torch.load becomes torch_npu.utils.serialization.load (as in the real
    torch_npu), torch.nn.SyncBatchNorm runs on npu tensors, torch.nn.DataParallel
    works on one npu device and names DDP/torch_npu_run for several, and
    torch.compile traces npu RNNs through torch's decompositions, and flex
    attention accepts npu tensors. Idempotent."""
    from torch_npu.utils import serialization, syncbatchnorm, _data_parallel, _rnn_decompositions
    from torch_npu.utils import patch_flexattention
    serialization._install()
    syncbatchnorm._install()
    _data_parallel._install()
    _rnn_decompositions._install()
    patch_flexattention._install()


def get_cann_version(module="CANN"):
    r"""Version of a CANN package (``CANN``, ``RUNTIME``, ``COMPILER``, ``HCCL``,
    ``TOOLKIT``, ``OPP``, ``OPP_KERNEL``, ``DRIVER``): the emulated machine's."""
    return _cann.get_cann_version(module)


__all__ = ["npu_combine_tensors", "get_part_combined_tensor", "is_combined_tensor_valid", "FlopsCounter",
           "set_thread_affinity", "reset_thread_affinity", "save_async", "get_cann_version"]
