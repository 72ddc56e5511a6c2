// Device guard and stream/event semantics of the emulated device. Execution
// is synchronous: every stream is always idle, events complete when
// recorded, and an event's timestamp is the host time it was recorded at.
#pragma once

#include <c10/core/Stream.h>
#include <cstdint>

namespace torch_npu {

// The current stream of `device` on this thread (default stream id 0).
c10::Stream current_stream(int device);
void set_current_stream(const c10::Stream& stream);

struct EmuEvent {
  int device = -1;
  double recorded_us = -1;
  bool timing = false;
};

}  // namespace torch_npu
