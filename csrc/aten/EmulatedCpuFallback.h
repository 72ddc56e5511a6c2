// The emulated torch_npu CPU fallback (see EmulatedCpuFallback.cpp).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <string>
#include <utility>
#include <vector>

namespace torch_npu::exec {

struct FallbackStats {
  int64_t calls = 0;
  int64_t bytes_to_cpu = 0;
  int64_t bytes_to_npu = 0;
  int64_t ns = 0;  // wall time of the fallbacks, copies included
};

void emulated_cpu_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack);
std::vector<std::pair<std::string, FallbackStats>> fallback_stats();
void reset_fallback_stats();

}  // namespace torch_npu::exec
