// Trace hooks of the emulated device: the runtime, the guard and the caching
// allocator report stream/event/memory activity here, and the Python side
// (torch_npu.utils._npu_trace) turns the reports into callbacks for the NPU
// sanitizer. Off by default: each hook point then costs one relaxed atomic
// load and a branch. Identities passed on are the ones Python sees: stream =
// c10 stream id (torch.npu.Stream.npu_stream), event = the event handle
// (torch.npu.Event.npu_event), memory = the block's data pointer.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include <c10/core/Stream.h>
#include <c10/macros/Macros.h>

namespace torch_npu::trace {

// The order is the dispatcher's index into its registries (_npu_trace._REGISTRIES).
enum class Kind : int {
  AclStartExecution = 0,
  AclFinishExecution,
  EventCreation,
  EventDeletion,
  EventRecord,
  EventWait,
  MemoryAllocation,
  MemoryDeallocation,
  StreamCreation,
  DeviceSynchronization,
  StreamSynchronization,
  EventSynchronization,
  RecordStream,
  EraseStream,
};

// Modes of torch_npu._C._activate_npu_trace, as bits of the active mask.
constexpr int kStreamMode = 0;  // every stream/event/memory hook
constexpr int kKernelMode = 1;  // kernel launch start/finish only
constexpr uint32_t kStreamBit = 1u << kStreamMode;
constexpr uint32_t kKernelBit = 1u << kKernelMode;

extern std::atomic<uint32_t> g_active;

inline bool stream_hooks_on() { return C10_UNLIKELY((g_active.load(std::memory_order_relaxed) & kStreamBit) != 0); }
inline bool kernel_hooks_on() { return C10_UNLIKELY((g_active.load(std::memory_order_relaxed) & kKernelBit) != 0); }

// Receives every report. Installed by the Python bindings (it takes the GIL
// and calls the dispatcher); `name` is set for the kernel kinds only. It
// throws what a callback raised, except for the reports made from destructors
// (MemoryDeallocation, EventDeletion, AclFinishExecution), which never throw.
using Sink = void (*)(Kind kind, const std::string* name, int nargs, uint64_t a, uint64_t b);
void set_sink(Sink sink);

// Turns one mode on (kStreamMode or kKernelMode; raises on anything else).
// Modes accumulate; deactivate() turns every hook off again.
void activate(int mode);
void deactivate();
uint32_t active_mask();

// The stream identity handed to callbacks (its c10 id; unique per process
// except the default stream, 0 on every device, as CUDA's null stream).
inline uint64_t stream_handle(const c10::Stream& s) { return static_cast<uint64_t>(s.id()); }

// Reports; callers check stream_hooks_on()/kernel_hooks_on() first.
void fire(Kind kind);
void fire(Kind kind, uint64_t a);
void fire(Kind kind, uint64_t a, uint64_t b);
void fire_kernel(Kind kind, const std::string& op_name);

}  // namespace torch_npu::trace
