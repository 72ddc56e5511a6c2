"""Callback registries of the NPU trace hooks (the NPU twin of ``torch.cuda._gpu_trace``).

The C++ core reports stream, event and memory activity of the emulated device
once ``torch_npu._C._activate_npu_trace(mode)`` has switched its hooks on; every
report arrives here through one dispatcher (``_fire``) and is handed to the
callbacks registered for its kind, in registration order. With the hooks off
(the default) nothing reaches Python and each hook point costs the core one
relaxed atomic load.

Modes of ``_activate_npu_trace`` (they accumulate; ``torch_npu._C._deactivate_npu_trace()``
turns every hook off again, an emulator extra):

* ``0`` (stream check, ``SanitizerMode.STREAM``): every registry below except the two
  ``acl_*_execution`` ones;
* ``1`` (kernel check, ``SanitizerMode.KERNEL``): only ``acl_start_execution`` /
  ``acl_finish_execution``, around every npu kernel.

Callback arguments (positional; all identities are Python ints):

=============================  ==========================================
registry                       arguments
=============================  ==========================================
acl_start_execution            ``(op_name: str)`` e.g. ``"aten::add.Tensor"``
acl_finish_execution           ``(op_name: str)``
npu_event_creation             ``(event,)``
npu_event_deletion             ``(event,)``
npu_event_record               ``(event, stream)``
npu_event_wait                 ``(event, stream)``
npu_memory_allocation          ``(data_ptr,)``
npu_memory_deallocation        ``(data_ptr,)``
npu_stream_creation            ``(stream,)``
npu_device_synchronization     ``()``
npu_stream_synchronization     ``(stream,)``
npu_event_synchronization      ``(event,)``
npu_record_stream              ``(data_ptr, stream)``
npu_erase_stream               ``(data_ptr, stream)``
=============================  ==========================================

These match ``torch.cuda._sanitizer.EventHandler._handle_*``.

Identity rule (what a listener may rely on):

* ``stream`` is ``torch.npu.Stream.npu_stream`` of the same stream (equal to its
  ``stream_id``). The default stream is ``0`` on every device, like CUDA's null
  stream; every stream made by ``torch.npu.Stream()`` has an id unique in the
  process, whatever its device.
* ``event`` is ``torch.npu.Event.npu_event`` (its ``event_id``): the native handle,
  created at the event's first ``record`` (as on CUDA), so ``npu_event_creation``
  fires then, and an event never recorded is never created, waited on, or deleted.
* ``data_ptr`` is the start of a caching-allocator block, i.e. the
  ``untyped_storage().data_ptr()`` of the tensor that owns it. Allocation is
  reported after the block is taken, deallocation when the last reference goes
  (before the block can be reused); ``npu_record_stream`` / ``npu_erase_stream``
  carry the block pointer of the tensor's storage. The stream a block was
  allocated on (the current stream of its device at allocation) is
  ``torch_npu._C._npu_block_stream(data_ptr)`` while the block is in use,
  including inside the deallocation callback (``-1`` for memory that is not a
  caching-allocator block).

Order: each report fires synchronously, on the thread doing the work, before the
call that caused it returns (``Event.record`` fires creation, then record).

Errors: a callback that raises does not stop the others; after all ran, the first
exception propagates to the operation that fired it (``Stream()``,
``Event.record``, ``synchronize``, an allocation, ...). Reports made from a
destructor (deallocation, event deletion, a kernel's finish) cannot raise there:
their exception goes to ``sys.unraisablehook``.
"""
from typing import Callable, List, Tuple

__all__ = [
    "register_callback_for_acl_start_execution",
    "register_callback_for_acl_finish_execution",
    "register_callback_for_npu_event_creation",
    "register_callback_for_npu_event_deletion",
    "register_callback_for_npu_event_record",
    "register_callback_for_npu_event_wait",
    "register_callback_for_npu_memory_allocation",
    "register_callback_for_npu_memory_deallocation",
    "register_callback_for_npu_stream_creation",
    "register_callback_for_npu_device_synchronization",
    "register_callback_for_npu_stream_synchronization",
    "register_callback_for_npu_event_synchronization",
    "register_callback_for_npu_record_stream",
    "register_callback_for_npu_erase_stream",
]


class CallbackRegistry:
    """The callbacks of one kind of report, fired in registration order."""

    def __init__(self, name: str):
        self.name = name
        self.callback_list: List[Tuple[Callable, str]] = []

    def add_callback(self, cb: Callable, cb_name: str) -> None:
        """Register ``cb`` under ``cb_name`` (the name appears in error notes)."""
        if not callable(cb):
            raise TypeError(f"callback for {self.name} must be callable, got {type(cb).__name__}")
        self.callback_list.append((cb, cb_name))

    def fire_callbacks(self, *args) -> None:
        """Call every callback with ``args``; re-raise the first failure after all ran."""
        first = None
        for cb, cb_name in self.callback_list:
            try:
                cb(*args)
            except Exception as exc:  # noqa: BLE001 - re-raised below, after the other callbacks
                if first is None:
                    exc.add_note(f"Exception in callback {cb_name} for {self.name} registered with NPU trace")
                    first = exc
        if first is not None:
            raise first


NPUACLStartExecuteCallbacks = CallbackRegistry("[kernel check] NPU acl start execution")
NPUACLFinishExecuteCallbacks = CallbackRegistry("[kernel check] NPU acl finish execution")
NPUEventCreationCallbacks = CallbackRegistry("NPU event creation")
NPUEventDeletionCallbacks = CallbackRegistry("NPU event deletion")
NPUEventRecordCallbacks = CallbackRegistry("NPU event record")
NPUEventWaitCallbacks = CallbackRegistry("NPU event wait")
NPUMemoryAllocationCallbacks = CallbackRegistry("NPU memory allocation")
NPUMemoryDeallocationCallbacks = CallbackRegistry("NPU memory deallocation")
NPUStreamCreationCallbacks = CallbackRegistry("NPU stream creation")
NPUDeviceSynchronizationCallbacks = CallbackRegistry("NPU device synchronization")
NPUStreamSynchronizationCallbacks = CallbackRegistry("NPU stream synchronization")
NPUEventSynchronizationCallbacks = CallbackRegistry("NPU event synchronization")
NPURecordStreamCallbacks = CallbackRegistry("NPU record stream")
NPUEraseStreamCallbacks = CallbackRegistry("NPU erase stream")

# Indexed by the core's trace::Kind (csrc/core/NPUTrace.h); keep the orders equal.
_REGISTRIES = (
    NPUACLStartExecuteCallbacks,
    NPUACLFinishExecuteCallbacks,
    NPUEventCreationCallbacks,
    NPUEventDeletionCallbacks,
    NPUEventRecordCallbacks,
    NPUEventWaitCallbacks,
    NPUMemoryAllocationCallbacks,
    NPUMemoryDeallocationCallbacks,
    NPUStreamCreationCallbacks,
    NPUDeviceSynchronizationCallbacks,
    NPUStreamSynchronizationCallbacks,
    NPUEventSynchronizationCallbacks,
    NPURecordStreamCallbacks,
    NPUEraseStreamCallbacks,
)


def _fire(kind: int, *args) -> None:
    """The dispatcher the C++ hooks call (set by ``_activate_npu_trace``)."""
    _REGISTRIES[kind].fire_callbacks(*args)


def register_callback_for_acl_start_execution(cb: Callable[[str], None], cb_name: str) -> None:
    """``cb(op_name)`` before every npu kernel (kernel mode)."""
    NPUACLStartExecuteCallbacks.add_callback(cb, cb_name)


def register_callback_for_acl_finish_execution(cb: Callable[[str], None], cb_name: str) -> None:
    """``cb(op_name)`` after every npu kernel (kernel mode)."""
    NPUACLFinishExecuteCallbacks.add_callback(cb, cb_name)


def register_callback_for_npu_event_creation(cb: Callable[[int], None], cb_name: str) -> None:
    """``cb(event)`` when an event's native handle is created (its first record)."""
    NPUEventCreationCallbacks.add_callback(cb, cb_name)


def register_callback_for_npu_event_deletion(cb: Callable[[int], None], cb_name: str) -> None:
    """``cb(event)`` when a created event is destroyed."""
    NPUEventDeletionCallbacks.add_callback(cb, cb_name)


def register_callback_for_npu_event_record(cb: Callable[[int, int], None], cb_name: str) -> None:
    """``cb(event, stream)`` when ``event`` is recorded on ``stream``."""
    NPUEventRecordCallbacks.add_callback(cb, cb_name)


def register_callback_for_npu_event_wait(cb: Callable[[int, int], None], cb_name: str) -> None:
    """``cb(event, stream)`` when ``stream`` waits for a recorded ``event``."""
    NPUEventWaitCallbacks.add_callback(cb, cb_name)


def register_callback_for_npu_memory_allocation(cb: Callable[[int], None], cb_name: str) -> None:
    """``cb(data_ptr)`` after the caching allocator hands out a block."""
    NPUMemoryAllocationCallbacks.add_callback(cb, cb_name)


def register_callback_for_npu_memory_deallocation(cb: Callable[[int], None], cb_name: str) -> None:
    """``cb(data_ptr)`` when a block is freed (before it can be reused)."""
    NPUMemoryDeallocationCallbacks.add_callback(cb, cb_name)


def register_callback_for_npu_stream_creation(cb: Callable[[int], None], cb_name: str) -> None:
    """``cb(stream)`` when a new stream is created."""
    NPUStreamCreationCallbacks.add_callback(cb, cb_name)


def register_callback_for_npu_device_synchronization(cb: Callable[[], None], cb_name: str) -> None:
    """``cb()`` on ``torch.npu.synchronize()`` (and ``torch.accelerator.synchronize()``)."""
    NPUDeviceSynchronizationCallbacks.add_callback(cb, cb_name)


def register_callback_for_npu_stream_synchronization(cb: Callable[[int], None], cb_name: str) -> None:
    """``cb(stream)`` on ``Stream.synchronize()``."""
    NPUStreamSynchronizationCallbacks.add_callback(cb, cb_name)


def register_callback_for_npu_event_synchronization(cb: Callable[[int], None], cb_name: str) -> None:
    """``cb(event)`` on ``Event.synchronize()`` of a recorded event."""
    NPUEventSynchronizationCallbacks.add_callback(cb, cb_name)


def register_callback_for_npu_record_stream(cb: Callable[[int, int], None], cb_name: str) -> None:
    """``cb(data_ptr, stream)`` on ``Tensor.record_stream(stream)`` of a pool block."""
    NPURecordStreamCallbacks.add_callback(cb, cb_name)


def register_callback_for_npu_erase_stream(cb: Callable[[int, int], None], cb_name: str) -> None:
    """``cb(data_ptr, stream)`` on ``torch_npu.erase_stream(tensor, stream)`` of a pool block."""
    NPUEraseStreamCallbacks.add_callback(cb, cb_name)
