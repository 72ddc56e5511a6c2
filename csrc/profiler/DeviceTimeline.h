// The device timeline: one record per kernel executed on an emulated npu
// device, for torch_npu.profiler. The emulated device is synchronous, so a
// kernel's device interval is the host interval of its execution.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace torch_npu::timeline {

enum class Kind { Kernel, Fallback, Communication };

struct Event {
  std::string name;
  int device;
  int64_t stream;
  int64_t start_ns;  // system clock, ns since the epoch (time.time_ns())
  int64_t end_ns;
  Kind kind;
  int64_t bytes;  // fallback: bytes copied host<->device; communication: payload
  uint64_t thread_id;
};

// Recording is off by default; when off, the execution layer pays one
// relaxed atomic load per kernel.
void enable(bool on);
bool enabled();
int64_t now_ns();
void record(Event event);
std::vector<Event> drain();
const char* kind_name(Kind kind);

}  // namespace torch_npu::timeline
