// Device guard and stream/event semantics of the emulated device. Execution
// is synchronous: every stream is always idle, events complete when
// recorded, and an event's timestamp is the host time it was recorded at.
#pragma once

#include <c10/core/Stream.h>
#include <cstdint>

namespace torch_npu {

// The current stream of `device` on this thread (default stream id 0).
c10::Stream current_stream(int device);
// Its id only, for a device the caller has validated (the allocator's hot path).
c10::StreamId current_stream_id(int device);
void set_current_stream(const c10::Stream& stream);

// The event identity the trace hooks report (torch.npu.Event.npu_event).
uint64_t event_handle(const void* event);

// Stream / device synchronisation: nothing to wait for on a synchronous
// device, but the host now knows the stream(s) progressed (the allocator's
// stream-ordered reuse) and the trace hooks report it.
void synchronize_stream(const c10::Stream& stream);
void synchronize_device(int device);

struct EmuEvent {
  int device = -1;
  double recorded_us = -1;
  bool timing = false;
};

}  // namespace torch_npu
