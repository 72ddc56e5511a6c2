"""Run CUDA code unchanged on the NPU.

``import torch_npu.contrib.transfer_to_npu`` (or ``TORCH_TRANSFER_TO_NPU=1``) patches torch
at run time, as the real tool does:

- ``torch.cuda`` (and ``torch.cuda.amp``, ``.random``, ``.amp.*``) take torch.npu's functions;
- device arguments ``"cuda"``/``"cuda:i"``/``torch.device("cuda", i)`` become NPU ones in the
  factories, loaders, ``Tensor``/``Module`` methods and torch.cuda functions of the real list;
- ``Tensor.cuda``/``Module.cuda``/``is_cuda`` become their NPU versions;
- ``torch.Generator``/``torch.Event`` become device-rewriting proxies;
- distributed: backend ``nccl`` -> ``hccl`` (``"cuda:nccl"`` -> ``"npu:hccl"``),
  ``is_nccl_available``, ``ProcessGroupNCCL``, no default ``cuda`` backend;
- autocast device-type queries, the profiler, ``torch.jit.script`` (disabled),
  triton detection (off), and the client-library shims;
- a banner (``ImportWarning``) and the jit warning, once per job: in the first process that
  patches (the launcher with ``TORCH_TRANSFER_TO_NPU=1``, or rank 0, or the parent of
  ``mp.spawn`` workers), never again in the ranks or children it starts;
  ``ASCEND_GLOBAL_LOG_LEVEL`` 0 or 1 (debug, info) prints them in every process.

Importing twice patches once (Python caches the module).
"""
import importlib
import os
import sys
import warnings

import torch

import torch_npu
from torch_npu import _settings
from torch_npu.contrib._transfer import libraries, proxies, rewrite, targets

__all__ = []

warnings.filterwarnings(action="once")

# torch.cuda.is_available before patching: what the client-library shims restore.
_cuda_is_available = torch.cuda.is_available

# Set in the environment once the banner and warnings were shown, so that the processes this one
# starts (torch_npu_run / torchrun ranks, mp.spawn workers, subprocesses) inherit "shown".
_NOTICES_SHOWN = "_TORCH_NPU_TRANSFER_NOTICES_SHOWN"

_JIT_WARNING = ("torch.jit.script and torch.jit.script_method will be disabled by transfer_to_npu, "
                "which currently does not support them, if you need to enable them, please do not use "
                "transfer_to_npu.")


def _resolve(spec):
    """``"module:Class.attr"`` -> (owner object, attribute name), or ``None`` if absent."""
    module_name, path = spec.split(":")
    try:
        owner = importlib.import_module(module_name)
        *outer, attr = path.split(".")
        for part in outer:
            owner = getattr(owner, part)
    except (ImportError, AttributeError):
        return None
    return (owner, attr) if hasattr(owner, attr) else None


def _public_names(module):
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n in vars(module) if not n.startswith("_")]
    return names


def _patch_cuda_modules():
    for target, source in targets.CUDA_MODULES:
        try:
            src = importlib.import_module(source)
            dst = importlib.import_module("torch." + target)
        except ImportError:
            continue
        for name in _public_names(src):
            if hasattr(src, name):
                setattr(dst, name, getattr(src, name))
    npu = torch_npu.npu
    cuda = torch.cuda
    # Submodule attributes (torch.cuda.amp is torch.cuda's attribute, kept as the
    # patched module so `from torch.cuda.amp import autocast` sees NPU names).
    if hasattr(npu, "default_generators"):
        cuda.default_generators = npu.default_generators
    memory = getattr(npu, "memory", None)
    for name in ("_record_memory_history", "_snapshot", "_dump_snapshot"):
        if memory is not None and hasattr(memory, name):
            setattr(cuda.memory, name, getattr(memory, name))
    if hasattr(npu, "host_empty_cache"):
        torch._C._host_emptyCache = npu.host_empty_cache
    if hasattr(npu, "NPUGraph"):
        cuda.CUDAGraph = npu.NPUGraph
    if hasattr(npu, "FloatTensor"):
        # float64 is not supported by the NPU's cube units.
        cuda.DoubleTensor = npu.FloatTensor
    # torch.cuda.* queries that torch's own modules (checkpoint, data loader) call.
    for name in ("is_available", "device_count", "current_device", "is_initialized", "_lazy_init",
                 "get_amp_supported_dtype", "is_bf16_supported"):
        if hasattr(npu, name):
            setattr(cuda, name, getattr(npu, name))
    rewrite.wrap_attributes(cuda, targets.CUDA_FUNCTIONS, "torch.cuda")
    rewrite.wrap_attributes(cuda.random, ("get_rng_state", "set_rng_state"), "torch.cuda.random")
    cuda.device.__init__ = rewrite.device_args(cuda.device.__init__, "torch.cuda.device")


def _autocast_device(device_type):
    return "npu" if device_type in (None, "cuda") else device_type


def _patch_autocast():
    is_enabled = torch.is_autocast_enabled
    set_enabled = torch.set_autocast_enabled

    def is_autocast_enabled(device_type=None):
        return is_enabled(_autocast_device(device_type))

    def set_autocast_enabled(*args):
        # torch accepts (enabled) for CUDA, or (device_type, enabled).
        if len(args) == 1:
            return set_enabled("npu", args[0])
        return set_enabled(_autocast_device(args[0]), args[1])

    torch.is_autocast_enabled = is_autocast_enabled
    torch.set_autocast_enabled = set_autocast_enabled
    torch.get_autocast_gpu_dtype = lambda: torch.get_autocast_dtype("npu")
    torch.set_autocast_gpu_dtype = lambda dtype: torch.set_autocast_dtype("npu", dtype)


def _patch_device_arguments():
    rewrite.wrap_attributes(torch, targets.TORCH_FUNCTIONS, "torch")
    rewrite.wrap_attributes(torch.Tensor, targets.TENSOR_METHODS, "torch.Tensor")
    rewrite.wrap_attributes(torch.nn.Module, targets.MODULE_METHODS, "torch.nn.Module")
    torch.UntypedStorage.__new__ = rewrite.device_args(torch.UntypedStorage.__new__, "torch.UntypedStorage")
    for spec in targets.DEVICE_CALLABLES:
        found = _resolve(spec)
        if found:
            owner, attr = found
            setattr(owner, attr, rewrite.device_args(getattr(owner, attr), spec.replace(":", ".")))
    kernel = _resolve("torch.autograd.profiler_util:Kernel")
    if kernel:
        kernel_cls = getattr(*kernel)
        kernel_cls.__new__ = rewrite.device_args(kernel_cls.__new__, "torch.autograd.profiler_util.Kernel")
    proxies.install()


def _patch_cuda_methods():
    torch.Tensor.cuda = rewrite.recorded_alias(torch.Tensor.npu, "torch.Tensor.cuda")
    torch.Tensor.is_cuda = torch.Tensor.is_npu
    torch.nn.Module.cuda = rewrite.recorded_alias(torch.nn.Module.npu, "torch.nn.Module.cuda")
    if hasattr(torch.TypedStorage, "is_npu"):
        torch.TypedStorage.is_cuda = torch.TypedStorage.is_npu
    # UninitializedParameter.to must stay callable on lazy modules: it is checked by identity.
    from torch.nn.parameter import UninitializedTensorMixin
    allowed = UninitializedTensorMixin._allowed_methods
    for i, method in enumerate(allowed):
        if getattr(method, "__name__", "") == "to":
            allowed[i] = torch.Tensor.to


def _is_hccl_available():
    return "hccl" in torch.distributed.Backend.backend_list


def _patch_distributed():
    if not torch.distributed.is_available():
        return
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    for spec in targets.BACKEND_CALLABLES:
        found = _resolve(spec)
        if found:
            owner, attr = found
            setattr(owner, attr, rewrite.backend_args(getattr(owner, attr), "torch.distributed." + attr))
    import torch_npu.distributed
    is_hccl_available = getattr(torch_npu.distributed, "is_hccl_available", _is_hccl_available)
    dist.is_nccl_available = is_hccl_available
    c10d.is_nccl_available = is_hccl_available
    hccl_group = getattr(getattr(torch_npu._C, "_distributed_c10d", None), "ProcessGroupHCCL", None)
    if hccl_group is not None:
        dist.ProcessGroupNCCL = hccl_group
        c10d.ProcessGroupNCCL = hccl_group
    dist.Backend.default_device_backend_map.pop("cuda", None)


def _patch_profiler():
    npu_profiler = sys.modules.get("torch_npu.profiler")
    if npu_profiler is None:
        try:
            npu_profiler = importlib.import_module("torch_npu.profiler")
        except ImportError:
            npu_profiler = None
    activity = torch.profiler.ProfilerActivity
    # CUDA activity means the (renamed) PrivateUse1 device, i.e. the NPU.
    try:
        activity.CUDA = activity.PrivateUse1
    except (AttributeError, TypeError):
        pass
    if npu_profiler is None or not hasattr(npu_profiler, "profile"):
        return
    for name in ("profile", "schedule", "tensorboard_trace_handler", "ProfilerAction"):
        if hasattr(npu_profiler, name):
            setattr(torch.profiler, name, getattr(npu_profiler, name))
    # ProfilerActivity.CUDA now names Kineto's own NPU member (set above); CPU stays
    # Kineto's: torch_npu.profiler accepts Kineto's members, and rebinding them
    # would break torch.profiler / torch.autograd.profiler for the script.
    profile = torch.profiler.profile
    config_type = getattr(npu_profiler, "_ExperimentalConfig", None)

    class _NpuOnlyConfigProfile(profile):
        """Drops a CUDA ``experimental_config``, which the NPU profiler cannot take."""

        def __init__(self, *args, **kwargs):
            config = kwargs.get("experimental_config")
            if config is not None and config_type is not None and not isinstance(config, config_type):
                import logging
                logging.warning(
                    "The parameter experimental_config of torch.profiler.profile has been deleted by the tool "
                    "because it can only be used in cuda, please manually modify the code and use the "
                    "experimental_config parameter adapted to npu.")
                del kwargs["experimental_config"]
            super().__init__(*args, **kwargs)

    if isinstance(profile, type):
        _NpuOnlyConfigProfile.__name__ = profile.__name__
        torch.profiler.profile = _NpuOnlyConfigProfile


def _patch_jit(notices):
    if notices:
        warnings.warn(_JIT_WARNING, RuntimeWarning)

    def script(obj, optimize=None, _frames_up=0, _rcb=None, example_inputs=None):
        return obj

    def script_method(fn):
        return fn

    torch.jit.script = script
    torch.jit.script_method = script_method


def _patch_triton_and_inductor():
    def has_triton():
        return False

    def get_gpu_type():
        return "npu"

    import torch.utils._triton  # noqa: F401  (so later importers see the patched one)
    for name in targets.TRITON_HOLDERS:
        module = sys.modules.get(name)
        if module is None:
            continue
        if hasattr(module, "has_triton"):
            module.has_triton = has_triton
        if hasattr(module, "get_gpu_type"):
            module.get_gpu_type = get_gpu_type
    torch._utils._get_available_device_type = lambda: "npu"
    dynamo = sys.modules.get("torch._dynamo.trace_rules")
    if dynamo is not None:
        dynamo._disallowed_callable_ids.function_ids = None


def _banner():
    """The real tool's banner text, as an ImportWarning."""
    wrapped = (["torch." + n for n in targets.TORCH_FUNCTIONS]
               + ["torch.Tensor." + n for n in targets.TENSOR_METHODS]
               + ["torch.nn.Module." + n for n in targets.MODULE_METHODS])
    text = (
        "\n    " + "*" * 109 + "\n"
        "    The torch.Tensor.cuda and torch.nn.Module.cuda are replaced with torch.Tensor.npu and "
        "torch.nn.Module.npu now..\n"
        "    The torch.cuda.DoubleTensor is replaced with torch.npu.FloatTensor cause the double type is not "
        "supported now..\n"
        "    The backend in torch.distributed.init_process_group set to hccl now..\n"
        "    The torch.cuda.* and torch.cuda.amp.* are replaced with torch.npu.* and torch.npu.amp.* now..\n"
        "    The device parameters have been replaced with npu in the function below:\n"
        "    " + ", ".join(wrapped) + "\n"
        "    " + "*" * 109 + "\n    ")
    warnings.warn(text, ImportWarning)


def _verbose():
    """ASCEND_GLOBAL_LOG_LEVEL debug (0) or info (1): every process prints the notices."""
    return _settings.get("ASCEND_GLOBAL_LOG_LEVEL") in (0, 1)


def _notices_wanted():
    """Whether this process prints the banner and the one-time warnings (once per job)."""
    if _verbose():
        return True
    if _settings.get(_NOTICES_SHOWN):
        return False  # the launcher or a parent process printed them
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist.get_rank() == 0
    return _settings.get("RANK") in (None, 0)


def _init():
    notices = _notices_wanted()
    if notices:
        _banner()
        os.environ[_NOTICES_SHOWN] = "1"
    _patch_cuda_modules()
    _patch_profiler()
    _patch_device_arguments()
    _patch_cuda_methods()
    _patch_autocast()
    _patch_distributed()
    _patch_jit(notices)
    _patch_triton_and_inductor()
    libraries.install(_cuda_is_available)


_init()
