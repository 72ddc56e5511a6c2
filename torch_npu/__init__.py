"""torch_npu: the Ascend NPU plugin for PyTorch, with the NPU emulated on the CPU.

``import torch_npu`` (or plain ``import torch``, through the
``torch.backends`` autoload entry point) gives PyTorch an ``npu`` device.
"""
import atexit as _atexit
import gc as _gc
import os as _os

# The start-up sequence. Importing any torch_npu submodule has no side effect
# on PyTorch; everything that changes PyTorch happens here, in this order.
#
# 0. While torch_npu imports, `import torch` must not autoload torch_npu again.
_autoload_saved = _os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD")
_os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"



def _restore_autoload():
    if _autoload_saved is None:
        _os.environ.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    else:
        _os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = _autoload_saved


import torch  # noqa: E402

from torch_npu.version import __version__  # noqa: E402
from torch_npu import _settings  # noqa: E402

__all__ = []


def _other_accelerator():
    """The accelerator PyTorch already has, if it is not the NPU (None otherwise)."""
    try:
        acc = torch._C._get_accelerator().type
    except Exception:
        return None
    return None if acc in ("cpu", "npu", "privateuseone") else acc


_conflict = _other_accelerator()

# 1. The C extension, then the settings: every variable read at import is
#    checked now (SettingError names the variable and the value), and the C++
#    core gets its values (it reads no environment itself).
import torch_npu._C  # noqa: E402

_settings.push_to_core()
from torch_npu.utils._error_code import ErrCode, pta_error  # noqa: E402

if _conflict is not None:
    raise RuntimeError(
        f"Two accelerators cannot be used at the same time in PyTorch: npu and {_conflict}. You can install the "
        f"cpu version of PyTorch to use your npu device, or use the {_conflict} device with "
        f"'export TORCH_DEVICE_BACKEND_AUTOLOAD=0'." + pta_error(ErrCode.NOT_SUPPORT))
try:
    _settings.validate("import")
except ValueError:
    _restore_autoload()  # a failed import leaves the user's environment as it was
    raise

# 2. Logging (TORCH_NPU_LOGS, ASCEND_GLOBAL_LOG_LEVEL ...), connected to the C++ core's records.
import torch_npu.utils._logging  # noqa: E402

torch_npu.utils._logging.configure()

# 3. The device module, as the real plugin registers it: PrivateUse1 renamed
#    "npu", torch.npu is torch_npu.npu, generated Tensor/Module/Storage methods.
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


# 4. The C++ kernels: zero-copy CPU kernels, the emulated CPU fallback.
_kernel_registration = torch_npu._C._initExtension(_native_npu_ops())

# 5. The emulated CANN: version facts (torch.version.cann, _C's version functions).
torch.version.cann = torch_npu.version.cann
import torch_npu.utils  # noqa: E402
# CANN's set_env.sh variables (ASCEND_HOME_PATH ...) for clients such as DeepSpeed,
# unless the user set their own (TORCH_NPU_EMU_CANN_ENV=0 turns this off).
torch_npu.utils._cann_env.apply_to_process_env()

torch_npu.utils._cann.install_c_fallbacks()

# The emulated device computes with CPU kernels (OpenMP). PyTorch would run
# npu backward passes on a per-device autograd thread, whose parallel regions
# then start a second OpenMP team that oversubscribes the cores and slows every
# kernel in the process (2x on a small MLP step). So backward runs on the
# calling thread, as it does for CPU tensors; TORCH_NPU_EMU_AUTOGRAD_THREADS=1
# restores PyTorch's device threads.
if not _settings.get("TORCH_NPU_EMU_AUTOGRAD_THREADS"):
    torch._C._set_multithreading_enabled(False)

# 6. The package's API: emulator facts, dtype constants, custom ops, optimizers,
#    the hccl backend, profiler, torch.compile backends, multiprocessing reductions.
from torch_npu import emulator  # noqa: E402,F401
# torch_npu._C._cd.DType and the integer dtype constants torch_npu.hifloat8, .float8_e4m3fn ...
from torch_npu.utils import _custom_dtype  # noqa: E402

_custom_dtype.install(torch_npu)
import torch_npu.op_plugin  # noqa: E402,F401
from torch_npu.op_plugin.tensor.formats import Format  # noqa: E402,F401
import torch_npu.optim  # noqa: E402,F401
import torch_npu.distributed  # noqa: E402,F401
import torch_npu.profiler  # noqa: E402,F401
import torch_npu.dynamo  # noqa: E402
from torch_npu.utils.hif8_tensor import HiFloat8Tensor  # noqa: E402,F401
import torch_npu.multiprocessing  # noqa: E402,F401  (npu tensor/event IPC reductions)

# 7. Patches of PyTorch: torch.load, SyncBatchNorm; the hccl backend and
#    torch.distributed's patches; npu tensor/event reductions for
#    torch.multiprocessing; torchair / npugraph_ex modules, torch.compile's npu
#    route (dynamo itself is registered lazily, when something imports it).
torch_npu.utils._install_patches()
torch_npu.distributed._install()
torch_npu.multiprocessing.reductions._install()
torch_npu.dynamo._install()
#    TORCH_NPU_EMU_NUMERICS=chip: the chip-numerics kernels (none in the default exact mode).
torch_npu.emulator._numerics.apply_setting()

# 8. Optional features: TORCH_NPU_SANITIZER (any value) enables the NPU stream
#    sanitizer (a dispatch mode over every op, fed by the runtime's trace);
#    imported only then.
if _settings.is_set("TORCH_NPU_SANITIZER"):
    from torch_npu.npu import _sanitizer as _npu_sanitizer

    _npu_sanitizer.enable_npu_sanitizer()

# 9. Autoload hooks: restore the user's TORCH_DEVICE_BACKEND_AUTOLOAD, flush
#    autograd device threads at exit, TORCH_TRANSFER_TO_NPU (at the end of this file).
_restore_autoload()


def __getattr__(name):
    # _ShardedGradScaler imports FSDP (about 3 s of import time): loaded on first access.
    if name == "_ShardedGradScaler":
        from torch_npu.npu.amp.sharded_grad_scaler import _ShardedGradScaler
        return _ShardedGradScaler
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _npu_shutdown():
    """At exit: let the autograd device threads drop the last user graph
    before Python finalizes (otherwise a late release can abort the process),
    then freeze the garbage collector's view of the heap.

    Finalization runs several full collections over every tracked object
    (PyTorch alone tracks ~300K, after torch.compile or a test session many
    more): seconds of CPU after the script's last statement, minutes for a
    large pytest session on a loaded machine. Everything alive now is either
    still referenced (freed by reference counting as modules are cleared) or
    a cycle left at exit, which Python does not promise to finalize;
    ``gc.freeze()`` takes it out of those collections. Objects created after
    this point (by exit handlers registered before torch_npu) are collected as
    usual, and weakref.finalize / atexit callbacks run as usual."""
    try:
        if torch_npu.npu.is_initialized():
            torch_npu._C._npu_flush_autograd_threads()
    except Exception:  # never fail the interpreter's exit
        pass
    _gc.freeze()


_atexit.register(_npu_shutdown)


def _autoload():
    """Entry point of ``[torch.backends]``: importing this module is the work."""
    return None


def _transfer_to_npu_if_asked():
    """``TORCH_TRANSFER_TO_NPU=1``: apply the CUDA-to-NPU patch once the package is ready."""
    if _settings.get("TORCH_TRANSFER_TO_NPU"):
        import torch_npu.contrib.transfer_to_npu  # noqa: F401


_transfer_to_npu_if_asked()
