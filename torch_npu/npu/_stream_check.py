"""The stream check of the NPU sanitizer: happens-before over launches and synchronisations.

Built on PyTorch's CUDA sanitizer (``torch.cuda._sanitizer``, "CSAN"): its
``EventHandler`` keeps, per stream, which launches of the other streams it is
ordered after (stream/event/device synchronisations), and per data pointer the
last write and the reads since; an access not ordered after a conflicting one
is an ``UnsynchronizedAccessError``. This module feeds it from the npu side:

- :class:`NPUArgumentHandler` reads an op's schema (alias info: ``Tensor(a!)``
  is written, a view is metadata only) and collects the npu data pointers read
  and written;
- :class:`NPUSanitizerDispatchMode` sees every op, runs it, and reports it as
  a kernel launch on the current stream of the tensors' device; conflicts
  raise ``torch.cuda._sanitizer.CUDASanitizerErrors`` (printed first, with
  both stack traces);
- :class:`NPURecordStreamHandler` adds the missing-``record_stream`` check:
  memory allocated on stream A, used on stream B, freed while A has not
  waited for that use and ``record_stream(B)`` was not called, is reported as
  a :class:`MissingRecordStreamError` (at the free, or on
  :meth:`NPURecordStreamHandler.flush_record_stream_warnings`);
- a host access (any CPU op) to the pinned destination of a ``non_blocking``
  device-to-host copy before the host synchronised with the copy's stream is
  an :class:`UnsynchronizedHostAccessError`. CSAN and the real torch_npu do
  not look at CPU tensors; this check is added here because the emulated
  device is synchronous and would otherwise hide the bug. Reads that bypass
  the dispatcher (``.numpy()``, ``.tolist()``, the buffer protocol) are not
  seen.

The runtime events (allocations, frees, events, synchronisations,
``record_stream``) arrive through ``torch_npu.utils._npu_trace``; see
``torch_npu.npu._sanitizer`` for the wiring.
"""
import contextlib
import inspect
import io
import logging
import os
import sys
import textwrap
import traceback
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Set

import torch
import torch.cuda._sanitizer as csan
from torch.utils._python_dispatch import TorchDispatchMode

import torch_npu

__all__ = []

logger = logging.getLogger(__name__)

_aten = torch.ops.aten
# Copies that may leave a host buffer being written by the device after they return.
_COPIES = (_aten._to_copy.default, _aten.copy_.default)
# Reads of one npu value into a host scalar: the host waits for the stream.
_HOST_SCALAR_READS = (_aten._local_scalar_dense.default,)
# Ops on a host tensor that read no data (no host access for the non_blocking copy check).
_HOST_METADATA_OPS = (_aten.is_pinned.default,)


# Frames of the sanitizer's own machinery, and the wrappers torch puts around a
# dispatch mode: cut from the traces shown to the user.
_MACHINERY = tuple(os.path.join(os.path.dirname(torch_npu.__file__), *p) for p in (
    ("npu", "_stream_check.py"), ("npu", "_sanitizer.py"), ("utils", "_npu_trace.py")))
_WRAPPERS = tuple(os.path.join(os.path.dirname(torch.__file__), *p) for p in (
    ("_compile.py",), ("_dynamo", "eval_frame.py"), ("_ops.py",)))


def _trim(trace: Optional[traceback.StackSummary]) -> Optional[traceback.StackSummary]:
    """Cut ``trace`` (in place) at the sanitizer's own frames, so it ends at the code that
    ran the op (or allocated the memory)."""
    if not trace:
        return trace
    cut = next((i for i, frame in enumerate(trace) if frame.filename in _MACHINERY), None)
    if cut is not None:
        while cut > 0 and trace[cut - 1].filename in _WRAPPERS:
            cut -= 1
        if cut > 0:
            del trace[cut:]
    return trace


def _stack_trace() -> traceback.StackSummary:
    """The caller's stack, outermost frame first (as CSAN records it), without the
    sanitizer's frames."""
    trace = traceback.StackSummary.extract(traceback.walk_stack(inspect.currentframe()), lookup_lines=False)
    trace.reverse()
    return _trim(trace)


def _current_stream_id(device_index: Optional[int] = None) -> int:
    """Id of the current stream of ``device_index`` (the current device when None), as the
    runtime reports it to the trace callbacks."""
    if device_index is None:
        device_index = torch_npu._C._npu_getDevice()
    stream_id, _, _ = torch_npu._C._npu_getCurrentStream(device_index)
    return int(stream_id)


def _allocation_stream(data_ptr: int) -> Optional[int]:
    """The stream the caching allocator gave the block at ``data_ptr`` to (the current
    stream when the allocator does not know the block); None when there is none."""
    block_stream = getattr(torch_npu._C, "_npu_block_stream", None)
    if block_stream is not None:
        stream = block_stream(data_ptr)
        if stream >= 0:
            return int(stream)
    try:
        return _current_stream_id()
    except RuntimeError:
        return None


def _npu_data_ptr(value) -> Optional[int]:
    """The data pointer of an npu tensor with storage; None for anything else (CPU, meta,
    fake and wrapper tensors have no npu memory to race on)."""
    if not isinstance(value, torch.Tensor) or value.device.type != "npu":
        return None
    try:
        ptr = value.data_ptr()
    except (RuntimeError, NotImplementedError):
        return None
    # CSAN's rule: a null pointer (empty tensor) is told apart by the object's id.
    return ptr if ptr else id(value)


def _storage_ptr(value) -> Optional[int]:
    try:
        ptr = value.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError, AttributeError):
        return None
    return ptr or None


@dataclass
class CrossStreamUsage:
    """The latest use of an allocation on a stream other than its allocation stream."""
    usage_stream: csan.StreamId
    seq_num: csan.SeqNum
    operator: str
    stack_trace: traceback.StackSummary


@dataclass
class NPUTensorInfo:
    """Per allocation: its stream, where it was allocated, the streams given to
    ``record_stream`` and its uses on other streams (for the record_stream check; the
    read/write history for races is CSAN's ``TensorInfo``)."""
    allocation_stream: Optional[csan.StreamId] = None
    allocation_stack_trace: Optional[traceback.StackSummary] = None
    recorded_streams: Set[csan.StreamId] = field(default_factory=set)
    cross_stream_usages: Dict[csan.StreamId, CrossStreamUsage] = field(default_factory=dict)


class MissingRecordStreamError(csan.SynchronizationError):
    """Memory allocated on one stream was used on another and freed (or flushed) while
    neither ``record_stream(usage_stream)`` was called nor the allocation stream had
    waited for that use (``wait_stream``, ``wait_event``, a device synchronize). The
    caching allocator may then hand the memory out again on the allocation stream
    while the other stream still uses it."""

    def __init__(self, data_ptr: csan.DataPtr, allocation_stack_trace: Optional[traceback.StackSummary],
                 allocation_stream: csan.StreamId, usage_stream: csan.StreamId, usage: CrossStreamUsage,
                 recorded_streams: Set[csan.StreamId]):
        super().__init__(data_ptr, allocation_stream, usage_stream)
        self.data_ptr = data_ptr
        self.allocation_stack_trace = allocation_stack_trace
        self.allocation_stream = allocation_stream
        self.usage_stream = usage_stream
        self.usage = usage
        self.recorded_streams = recorded_streams

    def __repr__(self):
        return (f"MissingRecordStreamError(data_ptr={self.data_ptr}, alloc_stream={self.allocation_stream}, "
                f"usage_stream={self.usage_stream}, operator={self.usage.operator!r})")

    def __str__(self):
        with io.StringIO() as out:
            out.write(textwrap.dedent(f"""\
                ============================
                NPUSanitizer: missing record_stream detected!
                Tensor (data ptr: {self.data_ptr}) allocated on stream {self.allocation_stream}
                was used on stream {self.usage_stream} and released without
                tensor.record_stream({self.usage_stream}) or the allocation stream waiting for that use.

                The caching allocator may give this memory to a new tensor on stream
                {self.allocation_stream} while stream {self.usage_stream} still reads or writes it.

                Fix with ONE of:
                  A) tensor.record_stream(usage_stream) after the use on the usage stream
                  B) allocation_stream.wait_stream(usage_stream) (or wait_event on an event
                     recorded on the usage stream) before the tensor is released

                Use on stream {self.usage_stream} during kernel:
                {self.usage.operator}
                """))
            out.write(f"With stack trace:\n{''.join(self.usage.stack_trace.format())}\n")
            out.write(f"Streams recorded via record_stream: {sorted(self.recorded_streams)}\n"
                      if self.recorded_streams else "No streams were recorded via record_stream.\n")
            if self.allocation_stack_trace:
                out.write(f"Tensor was allocated with stack trace:\n{''.join(self.allocation_stack_trace.format())}")
            else:
                out.write("Trace for tensor allocation not found.")
            return out.getvalue()


@dataclass
class _PendingHostCopy:
    """A non_blocking device-to-host copy into pinned memory, not yet waited for by the host."""
    storage: Any            # StorageWeakRef of the host buffer (the entry dies with it)
    stream: csan.StreamId
    seq_num: csan.SeqNum
    operator: str
    stack_trace: traceback.StackSummary


class UnsynchronizedHostAccessError(csan.SynchronizationError):
    """The host touched the destination of a ``non_blocking`` device-to-host copy before
    it synchronised with the stream that runs the copy: on a real NPU the copy may not
    have landed yet, so the host reads stale bytes (or its write is overwritten)."""

    def __init__(self, data_ptr: int, copy: _PendingHostCopy, operator: str,
                 stack_trace: traceback.StackSummary):
        super().__init__(data_ptr, copy.stream, operator)
        self.data_ptr = data_ptr
        self.copy = copy
        self.operator = operator
        self.stack_trace = stack_trace

    def __str__(self):
        with io.StringIO() as out:
            out.write(textwrap.dedent(f"""\
                ============================
                NPUSanitizer: host access to a non_blocking device-to-host copy before synchronization!
                Host tensor (data ptr: {self.data_ptr}) is the destination of a non_blocking copy
                on stream {self.copy.stream}, and the host used it before waiting for that stream.

                Fix with ONE of:
                  A) torch.npu.synchronize() (or stream.synchronize(), or event.synchronize() on an
                     event recorded after the copy) before the host uses the tensor
                  B) copy with non_blocking=False

                Host access during:
                {self.operator}
                """))
            out.write(f"With stack trace:\n{''.join(self.stack_trace.format())}\n")
            out.write(f"Copy on stream {self.copy.stream} during kernel:\n{self.copy.operator}\n"
                      f"With stack trace:\n{''.join(self.copy.stack_trace.format())}")
            return out.getvalue()


class NPURecordStreamHandler(csan.EventHandler):
    """CSAN's ``EventHandler`` plus the missing-``record_stream`` check.

    Races are checked at each launch (CSAN). The record_stream check is deferred to the
    free (``_handle_memory_deallocation``) or to :meth:`flush_record_stream_warnings`:
    what matters is whether the allocation stream waited for the other stream's use
    before the memory could be reused, not the order at the launch. With
    ``check_record_stream=False`` the free reports nothing (an explicit flush still does).
    """

    def __init__(self, check_record_stream: bool = True) -> None:
        super().__init__()
        self.check_record_stream = check_record_stream
        self.print_errors = True  # False: only kept in record_stream_errors (preflight)
        self._npu_tensors: Dict[csan.DataPtr, NPUTensorInfo] = {}
        self.record_stream_errors: List[MissingRecordStreamError] = []
        self._pending_host_copies: Dict[int, _PendingHostCopy] = {}

    # -- runtime events -------------------------------------------------------------------
    def _handle_memory_allocation(self, data_ptr: csan.DataPtr, stream: Optional[csan.StreamId] = None) -> None:
        """An allocation; ``stream`` is the allocation stream (the current one when None)."""
        super()._handle_memory_allocation(data_ptr)
        _trim(self.tensors_accessed.get_allocation_stack_trace(data_ptr))
        if stream is None:
            stream = _allocation_stream(data_ptr)
        self._npu_tensors[data_ptr] = NPUTensorInfo(
            allocation_stream=stream,
            allocation_stack_trace=self.tensors_accessed.get_allocation_stack_trace(data_ptr))

    def _handle_memory_deallocation(self, data_ptr: csan.DataPtr, *_ignored) -> None:
        """A free: report missing record_stream calls for it, then forget it."""
        if data_ptr in self._npu_tensors:
            if self.check_record_stream:
                for error in self._get_record_stream_errors(data_ptr):
                    if self.print_errors:
                        print(error, file=sys.stderr)
                    self.record_stream_errors.append(error)
            del self._npu_tensors[data_ptr]
        super()._handle_memory_deallocation(data_ptr)

    def _handle_record_stream(self, data_ptr: csan.DataPtr, stream: csan.StreamId) -> None:
        """``tensor.record_stream(stream)`` on the allocation starting at ``data_ptr``."""
        self._npu_tensors.setdefault(data_ptr, NPUTensorInfo()).recorded_streams.add(stream)

    def _handle_erase_stream(self, data_ptr: csan.DataPtr, stream: csan.StreamId) -> None:
        """A recorded stream no longer holds the allocation (communication finished with it)."""
        info = self._npu_tensors.get(data_ptr)
        if info is not None:
            info.recorded_streams.discard(stream)

    def _handle_host_wait_for_stream(self, stream: csan.StreamId) -> None:
        """The host waited for ``stream`` alone (a blocking copy to the host on it)."""
        self.syncs._ensure_stream_exists(stream)
        own = self.syncs.current_sync_states[stream].get(stream, 0)
        self.syncs.host_sync_state[stream] = max(self.syncs.host_sync_state.get(stream, -1), own)

    # -- launches -------------------------------------------------------------------------
    def _handle_kernel_launch(self, stream: csan.StreamId, read_only: Set[csan.DataPtr],
                              read_write: Set[csan.DataPtr], outputs: Set[csan.DataPtr], operator: str,
                              tensor_aliases: Dict[int, List[str]],
                              storage_dataptrs_accessed: Optional[Set[csan.DataPtr]] = None
                              ) -> List[csan.SynchronizationError]:
        """CSAN's race check, then the cross-stream uses of tracked allocations
        (by storage start, which is what allocation and record_stream report)."""
        errors = super()._handle_kernel_launch(stream, read_only, read_write, outputs, operator, tensor_aliases)
        # CSAN's accesses of this launch share one stack trace (the latest read or write).
        for data_ptr in read_write or read_only:
            info = self.tensors_accessed.accesses[data_ptr]
            access = info.write if data_ptr in read_write else info.reads[-1]
            _trim(access.stack_trace)
            break
        accessed = storage_dataptrs_accessed if storage_dataptrs_accessed is not None else (read_only | read_write)
        self._record_cross_stream_usage(stream, accessed, operator)
        return errors

    def _record_cross_stream_usage(self, stream: csan.StreamId, accessed: Set[csan.DataPtr], operator: str) -> None:
        trace = None
        for data_ptr in accessed:
            info = self._npu_tensors.get(data_ptr)
            if info is None or info.allocation_stream is None or info.allocation_stream == stream:
                continue
            if trace is None:
                trace = _stack_trace()
            # The latest use is the one the allocation stream must have waited for.
            info.cross_stream_usages[stream] = CrossStreamUsage(stream, self.seq_num, operator, trace)

    def _is_creation_stream_synced_to_usage(self, creation_stream: csan.StreamId, usage_stream: csan.StreamId,
                                            usage_seq_num: csan.SeqNum) -> bool:
        """Whether the allocation stream is ordered after the use (launch ``usage_seq_num``)."""
        state = self.syncs.current_sync_states.get(creation_stream, {})
        return state.get(usage_stream, -1) >= usage_seq_num

    def _get_record_stream_errors(self, data_ptr: csan.DataPtr) -> List[MissingRecordStreamError]:
        info = self._npu_tensors.get(data_ptr)
        if info is None or info.allocation_stream is None:
            return []
        return [MissingRecordStreamError(data_ptr, info.allocation_stack_trace, info.allocation_stream,
                                         usage_stream, usage, set(info.recorded_streams))
                for usage_stream, usage in info.cross_stream_usages.items()
                if usage_stream not in info.recorded_streams
                and not self._is_creation_stream_synced_to_usage(info.allocation_stream, usage_stream,
                                                                 usage.seq_num)]

    def flush_record_stream_warnings(self) -> List[MissingRecordStreamError]:
        """Check every live allocation now; print and return the missing record_stream
        errors (also appended to ``record_stream_errors``). Call it once the program's
        synchronisations are done: an allocation stream that waits later is not an error."""
        errors = []
        for data_ptr in list(self._npu_tensors):
            errors.extend(self._get_record_stream_errors(data_ptr))
        for error in errors:
            print(error, file=sys.stderr)
        self.record_stream_errors.extend(errors)
        return errors

    # -- non_blocking copies to the host --------------------------------------------------
    def _add_pending_host_copy(self, host_tensor: torch.Tensor, stream: csan.StreamId, operator: str) -> None:
        from torch.multiprocessing.reductions import StorageWeakRef
        storage = host_tensor.untyped_storage()
        if storage.data_ptr():
            self._pending_host_copies[storage.data_ptr()] = _PendingHostCopy(
                StorageWeakRef(storage), stream, self.seq_num, operator, _stack_trace())

    def _check_host_access(self, host_tensors: List[torch.Tensor], operator: str) -> List[csan.SynchronizationError]:
        """Errors for host tensors that are copies still in flight; entries the host has
        waited for (or whose memory is gone) are dropped."""
        errors = []
        for t in host_tensors:
            ptr = _storage_ptr(t)
            copy = self._pending_host_copies.get(ptr)
            if copy is None:
                continue
            if copy.storage.expired() or self.syncs.host_sync_state.get(copy.stream, -1) >= copy.seq_num:
                del self._pending_host_copies[ptr]
                continue
            errors.append(UnsynchronizedHostAccessError(ptr, copy, operator, _stack_trace()))
            del self._pending_host_copies[ptr]  # reported once
        return errors


class NPUArgumentHandler(csan.ArgumentHandler):
    """CSAN's argument parser for npu tensors: ``parse_inputs(schema, args, kwargs, *,
    is_factory)`` and ``parse_outputs(schema, outputs, *, is_factory)`` fill
    ``dataptrs_read``, ``dataptrs_written``, ``outputs`` and ``tensor_aliases`` from the
    schema's alias info (a written ``Tensor(a!)`` is a write, a view and a factory's
    input are metadata only), plus ``storage_dataptrs_accessed`` (storage starts, for
    the record_stream check), the first npu device seen and the CPU tensors passed in."""

    def __init__(self) -> None:
        super().__init__()
        self.storage_dataptrs_accessed: Set[csan.DataPtr] = set()
        self.device_index: Optional[int] = None
        self.host_tensors: List[torch.Tensor] = []

    def _handle_argument(self, value: Any, is_write: bool, metadata_only: bool, name: Optional[str] = None,
                         is_output: bool = False) -> None:
        if isinstance(value, torch.Tensor) and value.device.type == "cpu":
            if not (metadata_only or is_output):  # the host touches its data
                self.host_tensors.append(value)
            return
        data_ptr = _npu_data_ptr(value)
        if data_ptr is None:
            return
        if self.device_index is None:
            self.device_index = value.device.index
        if is_write:
            self.dataptrs_written.add(data_ptr)
        elif not metadata_only:
            self.dataptrs_read.add(data_ptr)
        self.tensor_aliases.setdefault(data_ptr, [])
        if name is not None:
            self.tensor_aliases[data_ptr].append(name)
        if is_output:
            self.outputs.add(data_ptr)
        if is_write or not metadata_only:
            storage_ptr = _storage_ptr(value)
            if storage_ptr is not None:
                self.storage_dataptrs_accessed.add(storage_ptr)


def _non_blocking_host_destination(func, args, kwargs, outputs) -> Optional[torch.Tensor]:
    """The pinned host tensor a non_blocking npu-to-host copy writes, else None (a copy to
    pageable memory is synchronous for the host, as on CUDA)."""
    if func is _aten._to_copy.default:
        src, dst = args[0], outputs
        non_blocking = kwargs.get("non_blocking", False)
    else:
        dst, src = args[0], args[1]
        non_blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
    if not (non_blocking and isinstance(src, torch.Tensor) and src.device.type == "npu"
            and isinstance(dst, torch.Tensor) and dst.device.type == "cpu"):
        return None
    return dst if dst.is_pinned() else None


class NPUSanitizerDispatchMode(TorchDispatchMode):
    """Reports every op on npu tensors to ``event_handler`` as a kernel launch on the
    current stream of their device; raises ``torch.cuda._sanitizer.CUDASanitizerErrors``
    (after printing each error) when the launch races with an earlier one."""

    # Errors kept when not raising (preflight's report mode), at most this many.
    MAX_COLLECTED = 10000

    def __init__(self, event_handler: csan.EventHandler):
        super().__init__()
        self.event_handler = event_handler
        self.args_handler: Optional[NPUArgumentHandler] = None
        # False: keep the errors in ``collected_errors`` and let the program go on
        # (``torch-npu preflight --stream-check``) instead of printing and raising.
        self.raise_errors = True
        self.collected_errors: List[csan.SynchronizationError] = []
        # Held around the handler's updates; the sanitizer shares it with the runtime's
        # callbacks, which may come from other threads.
        self.lock = contextlib.nullcontext()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = {} if kwargs is None else kwargs
        schema = getattr(func, "_schema", None)
        # record_stream is no launch: the runtime's trace reports it (by allocation start).
        if schema is None or func is _aten.record_stream.default:
            return func(*args, **kwargs)
        is_factory = bool(csan.FACTORY_FUNCTION_REGEX.match(schema.name))
        self.args_handler = handler = NPUArgumentHandler()
        self.parse_inputs(schema, args, kwargs, is_factory=is_factory)
        operator = str(schema)
        errors = []
        check_host = getattr(self.event_handler, "_check_host_access", None)
        if (check_host is not None and handler.host_tensors and self.event_handler._pending_host_copies
                and func not in _HOST_METADATA_OPS):
            with self.lock:
                errors += check_host(handler.host_tensors, operator)

        outputs = func(*args, **kwargs)

        self.parse_outputs(schema, outputs, is_factory=is_factory)
        if handler.dataptrs_read or handler.dataptrs_written or handler.outputs:
            try:
                stream = _current_stream_id(handler.device_index)
            except RuntimeError as err:
                logger.info("No current npu stream (%s); launch of %s not recorded", err, operator)
                stream = None
            if stream is not None:
                with self.lock:
                    errors += self.check_errors(func, stream, raise_errors=False)
                    if func in _COPIES and hasattr(self.event_handler, "_add_pending_host_copy"):
                        self._track_host_copy(func, args, kwargs, outputs, stream, operator)
                    elif func in _HOST_SCALAR_READS and hasattr(self.event_handler, "_handle_host_wait_for_stream"):
                        self.event_handler._handle_host_wait_for_stream(stream)
        if errors:
            if not self.raise_errors:
                room = self.MAX_COLLECTED - len(self.collected_errors)
                self.collected_errors.extend(errors[:max(room, 0)])
                return outputs
            for error in errors:
                print(error, file=sys.stderr)
            raise csan.CUDASanitizerErrors(errors)
        return outputs

    def _track_host_copy(self, func, args, kwargs, outputs, stream, operator):
        dst = _non_blocking_host_destination(func, args, kwargs, outputs)
        if dst is not None:
            self.event_handler._add_pending_host_copy(dst, stream, operator)
        elif isinstance(outputs, torch.Tensor) and outputs.device.type == "cpu":
            # A blocking copy to the host waits for its stream.
            if hasattr(self.event_handler, "_handle_host_wait_for_stream"):
                self.event_handler._handle_host_wait_for_stream(stream)

    def parse_inputs(self, schema, args, kwargs, is_factory=False):
        """Collect the npu pointers the op's arguments read and write."""
        self.args_handler.parse_inputs(schema, args, kwargs, is_factory=is_factory)

    def parse_outputs(self, schema, outputs, is_factory=False):
        """Collect the npu pointers the op's results write."""
        self.args_handler.parse_outputs(schema, outputs, is_factory=is_factory)

    def check_errors(self, func, npu_stream, raise_errors=True):
        """Report the parsed launch on ``npu_stream``; return (or, with ``raise_errors``,
        print and raise) the synchronisation errors it causes."""
        handler = self.args_handler
        kwargs = {}
        if isinstance(self.event_handler, NPURecordStreamHandler):
            kwargs["storage_dataptrs_accessed"] = handler.storage_dataptrs_accessed
        errors = self.event_handler._handle_kernel_launch(
            npu_stream, handler.dataptrs_read - handler.dataptrs_written, handler.dataptrs_written,
            handler.outputs, str(func._schema), handler.tensor_aliases, **kwargs)
        if errors and raise_errors:
            for error in errors:
                print(error, file=sys.stderr)
            raise csan.CUDASanitizerErrors(errors)
        return errors
