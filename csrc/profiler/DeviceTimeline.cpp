#include "profiler/DeviceTimeline.h"

#include <atomic>
#include <chrono>
#include <mutex>
#include <sys/syscall.h>
#include <unistd.h>

#include "aten/OpExecution.h"
#include "core/NPUGuard.h"

namespace torch_npu::timeline {
namespace {

std::mutex g_mu;
std::vector<Event> g_events;
std::atomic<bool> g_enabled{false};

// The OS thread id, as Kineto labels host threads.
uint64_t this_thread_id() { return static_cast<uint64_t>(::syscall(SYS_gettid)); }

// Observes kernels of the execution layer. Kernels can nest (a direct
// kernel calling another op), hence a per-thread stack of start times.
class TimelineObserver final : public exec::KernelObserver {
 public:
  void on_kernel_begin(const c10::OperatorHandle&, int) override { starts().push_back(now_ns()); }
  void on_kernel_end(const c10::OperatorHandle& op, int device, const exec::KernelInfo& info) override {
    auto& st = starts();
    if (st.empty()) return;  // recording was switched on inside this kernel
    const int64_t start = st.back();
    st.pop_back();
    const auto& name = op.schema().operator_name();
    std::string full = name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
    record({std::move(full), device, current_stream(device).id(), start, now_ns(),
            info.fallback ? Kind::Fallback : Kind::Kernel, info.bytes_copied, this_thread_id()});
  }

 private:
  static std::vector<int64_t>& starts() {
    thread_local std::vector<int64_t> s;
    return s;
  }
};

TimelineObserver g_observer;

}  // namespace

void enable(bool on) {
  if (g_enabled.exchange(on) == on) return;
  if (on) {
    exec::add_kernel_observer(&g_observer);
  } else {
    exec::remove_kernel_observer(&g_observer);
  }
}

bool enabled() { return g_enabled.load(std::memory_order_relaxed); }

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void record(Event event) {
  if (event.thread_id == 0) event.thread_id = this_thread_id();
  std::lock_guard<std::mutex> g(g_mu);
  g_events.push_back(std::move(event));
}

std::vector<Event> drain() {
  std::lock_guard<std::mutex> g(g_mu);
  std::vector<Event> out;
  out.swap(g_events);
  return out;
}

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::Kernel:
      return "kernel";
    case Kind::Fallback:
      return "fallback";
    case Kind::Communication:
      return "communication";
  }
  return "kernel";
}

}  // namespace torch_npu::timeline
