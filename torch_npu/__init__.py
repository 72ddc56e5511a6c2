"""torch_npu: the Ascend NPU plugin for PyTorch, with the NPU emulated on the CPU.

``import torch_npu`` (or plain ``import torch``, through the
``torch.backends`` autoload entry point) gives PyTorch an ``npu`` device.
"""
import atexit as _atexit
import os as _os

_autoload_saved = _os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD")
_os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"

import torch  # noqa: E402

from torch_npu.version import __version__  # noqa: E402
from torch_npu.utils._error_code import ErrCode, pta_error  # noqa: E402

__all__ = []


def _check_device_conflict():
    try:
        acc = torch._C._get_accelerator().type
    except Exception:
        return
    if acc not in ("cpu", "npu", "privateuseone"):
        raise RuntimeError(
            f"Two accelerators cannot be used at the same time in PyTorch: npu and {acc}. You can install the "
            f"cpu version of PyTorch to use your npu device, or use the {acc} device with "
            f"'export TORCH_DEVICE_BACKEND_AUTOLOAD=0'." + pta_error(ErrCode.NOT_SUPPORT))


_check_device_conflict()

import torch_npu._C  # noqa: E402
import torch_npu.utils._logging  # noqa: E402

# The loggers were configured before the C++ core was loaded: connect it.
torch_npu.utils._logging.configure()

# Same registration as the real plugin: PrivateUse1 renamed "npu", torch.npu
# is torch_npu.npu, generated Tensor/Module/Storage methods.
if torch._C._get_privateuse1_backend_name() != "npu":
    torch.utils.rename_privateuse1_backend("npu")

import torch_npu.npu  # noqa: E402

torch._register_device_module("npu", torch_npu.npu)
unsupported_dtype = [torch.quint8, torch.quint4x2, torch.quint2x4, torch.qint32, torch.qint8]
torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True, for_storage=True,
                                                     unsupported_dtype=unsupported_dtype)


# Ops the emulator itself runs to implement an op that is native on the NPU
# (scaled_dot_product_attention is an NPU kernel; here it runs CPU flash
# attention). They must not count as CPU fallbacks.
_EMULATION_INTERNAL_OPS = [
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention_for_cpu_backward",
]


def _native_npu_ops():
    """ATen overloads that have an NPU kernel in the real torch_npu 2.13.0."""
    path = _os.path.join(_os.path.dirname(__file__), "_data", "npu_native_ops.txt")
    with open(path, encoding="utf-8") as f:
        ops = [line.strip() for line in f if line.strip() and not line.startswith("#")]
    return ops + _EMULATION_INTERNAL_OPS


_kernel_registration = torch_npu._C._initExtension(_native_npu_ops())

torch.version.cann = torch_npu.version.cann
# CANN's set_env.sh variables (ASCEND_HOME_PATH ...) for clients such as DeepSpeed, unless the user set their own.
torch_npu.utils._cann_env.apply_to_process_env()
# torch_npu._C._get_cann_version/_is_gte_cann_version answer from the emulated CANN (Python).
torch_npu.utils._cann.install_c_fallbacks()

# The emulated device computes with CPU kernels (OpenMP). PyTorch would run
# npu backward passes on a per-device autograd thread, whose parallel regions
# then start a second OpenMP team that oversubscribes the cores and slows every
# kernel in the process (2x on a small MLP step). So backward runs on the
# calling thread, as it does for CPU tensors; TORCH_NPU_EMU_AUTOGRAD_THREADS=1
# restores PyTorch's device threads.
if _os.environ.get("TORCH_NPU_EMU_AUTOGRAD_THREADS", "0") != "1":
    torch._C._set_multithreading_enabled(False)

from torch_npu import emulator  # noqa: E402,F401
# torch_npu._C._cd.DType and the integer dtype constants torch_npu.hifloat8, .float8_e4m3fn ...
from torch_npu.utils import _custom_dtype  # noqa: E402

_custom_dtype.install(torch_npu)
import torch_npu.op_plugin  # noqa: E402,F401
from torch_npu.op_plugin.tensor.formats import Format  # noqa: E402,F401
import torch_npu.optim  # noqa: E402,F401
import torch_npu.distributed  # noqa: E402,F401  (registers the hccl backend)
from torch_npu.npu.amp.sharded_grad_scaler import _ShardedGradScaler  # noqa: E402,F401
import torch_npu.profiler  # noqa: E402,F401
import torch_npu.dynamo  # noqa: E402
from torch_npu.utils.hif8_tensor import HiFloat8Tensor  # noqa: E402,F401
import torch_npu.multiprocessing  # noqa: E402,F401  (npu tensor/event IPC reductions)

# torchair / npugraph_ex modules, torch.compile's npu route; dynamo itself is
# registered lazily, when something imports it.
torch_npu.dynamo._install()

if _autoload_saved is None:
    _os.environ.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
else:
    _os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = _autoload_saved


def _npu_shutdown():
    """At exit: let the autograd device threads drop the last user graph
    before Python finalizes (otherwise a late release can abort the process)."""
    try:
        if torch_npu.npu.is_initialized():
            torch_npu._C._npu_flush_autograd_threads()
    except Exception:  # never fail the interpreter's exit
        pass


_atexit.register(_npu_shutdown)


def _autoload():
    """Entry point of ``[torch.backends]``: importing this module is the work."""
    return None


def _transfer_to_npu_if_asked():
    """``TORCH_TRANSFER_TO_NPU=1``: apply the CUDA-to-NPU patch once the package is ready."""
    value = _os.environ.get("TORCH_TRANSFER_TO_NPU", "0")
    if value == "1":
        import torch_npu.contrib.transfer_to_npu  # noqa: F401
    elif value != "0":
        raise ValueError(f"Invalid value for TORCH_TRANSFER_TO_NPU: {value}. Only '0' or '1' is supported.")


_transfer_to_npu_if_asked()
