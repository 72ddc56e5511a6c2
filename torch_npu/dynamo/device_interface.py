"""The npu device as dynamo sees it: device interface and trace rules.

Registered when ``torch._dynamo`` is first imported (not at ``import
torch_npu``: dynamo costs about 2 s to import). The trace rules make
``torch.npu.current_device`` / ``is_available`` / ``device_count`` constants
(guarded like their ``torch.cuda`` twins) and route ``torch.npu.synchronize``
and ``torch.npu.current_stream`` through dynamo's generic stream handling, so
none of them breaks a graph.
"""
import torch
from torch._dynamo.device_interface import DeviceInterface, register_interface_for_device

import torch_npu


class NpuInterface(DeviceInterface):
    device = torch_npu.npu.device
    Event = torch_npu.npu.Event
    Stream = torch_npu.npu.Stream

    class Worker:
        @staticmethod
        def set_device(device: int) -> None:
            torch_npu.npu.set_device(device)

        @staticmethod
        def current_device() -> int:
            return torch_npu.npu.current_device()

        @staticmethod
        def get_device_properties(device=None):
            return torch_npu.npu.get_device_properties(device)

    current_device = staticmethod(torch_npu.npu.current_device)
    set_device = staticmethod(torch_npu.npu.set_device)
    device_count = staticmethod(torch_npu.npu.device_count)
    stream = staticmethod(torch_npu.npu.stream)
    current_stream = staticmethod(torch_npu.npu.current_stream)
    set_stream = staticmethod(torch_npu.npu.set_stream)
    synchronize = staticmethod(torch_npu.npu.synchronize)
    get_device_properties = staticmethod(torch_npu.npu.get_device_properties)
    memory_allocated = staticmethod(torch_npu.npu.memory_allocated)
    is_bf16_supported = staticmethod(torch_npu.npu.is_bf16_supported)

    @staticmethod
    def _set_stream_by_id(stream_id: int, device_index: int, device_type: int) -> None:
        torch_npu._C._npu_setStream(stream_id, device_index, device_type)

    @staticmethod
    def get_raw_stream(device_idx: int) -> int:
        return torch_npu.npu.current_stream(device_idx).stream_id

    @staticmethod
    def exchange_device(device: int) -> int:
        previous = torch_npu.npu.current_device()
        if device >= 0 and device != previous:
            torch_npu.npu.set_device(device)
        return previous

    maybe_exchange_device = exchange_device

    @staticmethod
    def is_available() -> bool:
        return torch_npu.npu.is_available()

    @staticmethod
    def get_compute_capability(device=None):
        return ""

    @staticmethod
    def is_triton_capable(device=None) -> bool:
        return False


def _register_trace_rules() -> None:
    from torch._dynamo import trace_rules
    from torch._dynamo.variables import torch as torch_variables
    from torch._dynamo.variables.torch import TorchInGraphFunctionVariable

    npu = torch_npu.npu
    guarded = (npu.current_device, npu.is_initialized)
    constant = (npu.is_available, npu.device_count, npu.get_device_name, npu.get_device_capability,
                npu.is_bf16_supported, npu.get_amp_supported_dtype)
    rules = trace_rules.get_torch_obj_rule_map()
    for fn in guarded + constant:
        rules[fn] = TorchInGraphFunctionVariable
        torch_variables.constant_fold_functions[fn] = None
    for fn in guarded:
        torch_variables.constant_fold_functions_need_guards[fn] = None

    # synchronize / current_stream: the handlers dynamo has for torch.cuda's.
    handlers = TorchInGraphFunctionVariable._get_handlers()
    for npu_fn, cuda_fn in ((npu.synchronize, torch.cuda.synchronize),
                            (npu.current_stream, torch.cuda.current_stream)):
        if cuda_fn in handlers:
            rules[npu_fn] = TorchInGraphFunctionVariable
            handlers[npu_fn] = handlers[cuda_fn]


def register() -> None:
    register_interface_for_device("npu", NpuInterface)
    _register_trace_rules()
