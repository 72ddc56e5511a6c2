// PrivateUse1 profiler stubs: torch.autograd.profiler.profile(use_device="npu")
// asks them for device events. The emulated device runs kernels
// synchronously on the host, so a device event is a host timestamp.
#include <torch/csrc/profiler/stubs/base.h>

#include <chrono>
#include <memory>

#include "runtime/AclRuntime.h"

namespace torch_npu::profiler {
namespace {

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct NPUProfilerStubs final : public torch::profiler::impl::ProfilerStubs {
  void record(c10::DeviceIndex* device, torch::profiler::impl::ProfilerVoidEventStub* event,
              int64_t* cpu_ns) const override {
    if (device) *device = static_cast<c10::DeviceIndex>(acl_emu::current_device_or_default());
    auto stamp = std::make_shared<int64_t>(steady_ns());
    if (cpu_ns) *cpu_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                              std::chrono::system_clock::now().time_since_epoch())
                              .count();
    *event = std::static_pointer_cast<void>(stamp);
  }
  // Microseconds, as the CUDA stubs answer.
  float elapsed(const torch::profiler::impl::ProfilerVoidEventStub* a,
                const torch::profiler::impl::ProfilerVoidEventStub* b) const override {
    const int64_t t0 = *static_cast<const int64_t*>(a->get());
    const int64_t t1 = *static_cast<const int64_t*>(b->get());
    return static_cast<float>(t1 - t0) / 1000.0f;
  }
  void mark(const char*) const override {}
  void rangePush(const char*) const override {}
  void rangePop() const override {}
  bool enabled() const override { return true; }
  void onEachDevice(std::function<void(int)> op) const override {
    int32_t prev = 0;
    acl_emu::aclrtGetDevice(&prev);
    uint32_t n = 0;
    acl_emu::aclrtGetDeviceCount(&n);
    for (uint32_t d = 0; d < n; ++d) {
      acl_emu::aclrtSetDevice(static_cast<int32_t>(d));
      op(static_cast<int>(d));
    }
    if (n > 0) acl_emu::aclrtSetDevice(prev);
  }
  void synchronize() const override {}  // kernels complete before they return
};

NPUProfilerStubs g_stubs;

}  // namespace

void register_profiler_stubs() { torch::profiler::impl::registerPrivateUse1Methods(&g_stubs); }

}  // namespace torch_npu::profiler
