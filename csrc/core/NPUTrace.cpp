#include "core/NPUTrace.h"

#include <c10/util/Exception.h>

#include "core/NPUException.h"

namespace torch_npu::trace {

std::atomic<uint32_t> g_active{0};

namespace {
std::atomic<Sink> g_sink{nullptr};

void deliver(Kind kind, const std::string* name, int nargs, uint64_t a, uint64_t b) {
  Sink sink = g_sink.load(std::memory_order_acquire);
  if (sink != nullptr) sink(kind, name, nargs, a, b);
}
}  // namespace

void set_sink(Sink sink) { g_sink.store(sink, std::memory_order_release); }

void activate(int mode) {
  TORCH_CHECK_VALUE(mode == kStreamMode || mode == kKernelMode, "_activate_npu_trace(): mode must be ", kStreamMode,
                    " (stream check) or ", kKernelMode, " (kernel check), got ", mode, PTA_ERROR(ErrCode::VALUE));
  g_active.fetch_or(1u << mode, std::memory_order_relaxed);
}

void deactivate() { g_active.store(0, std::memory_order_relaxed); }

uint32_t active_mask() { return g_active.load(std::memory_order_relaxed); }

void fire(Kind kind) { deliver(kind, nullptr, 0, 0, 0); }
void fire(Kind kind, uint64_t a) { deliver(kind, nullptr, 1, a, 0); }
void fire(Kind kind, uint64_t a, uint64_t b) { deliver(kind, nullptr, 2, a, b); }
void fire_kernel(Kind kind, const std::string& op_name) { deliver(kind, &op_name, 1, 0, 0); }

}  // namespace torch_npu::trace
