// The CPU fallback of the real torch_npu, emulated. On hardware, an ATen op
// that has a CPU kernel but no NPU kernel (not in npu_aten_ops.txt) runs
// through npu_cpu_fallback: it warns once per op, copies every argument to
// the CPU, runs there and copies the results (and mutated arguments) back.
// Here such ops do the same real copies, so their cost shows, and the
// counters tell which ops fell back and how many bytes they moved.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/EmptyTensor.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/ops/empty_strided.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <cstdlib>
#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <unordered_set>

#include "aten/EmulatedCpuFallback.h"
#include "core/EmuLog.h"
#include "aten/OpExecution.h"
#include "core/NPUCachingAllocator.h"
#include "core/NPUException.h"
#include "core/Settings.h"

namespace torch_npu::exec {
namespace {

std::mutex g_mu;
std::map<std::string, FallbackStats>* g_stats = new std::map<std::string, FallbackStats>();
std::unordered_set<std::string>* g_warned = new std::unordered_set<std::string>();

bool fallback_disabled() {
  // Cached at first read, as in torch_npu (value from torch_npu._settings).
  static const bool disabled = torch_npu::settings::flag("TORCH_NPU_FALLBACK_CPU_DISABLE", false);
  return disabled;
}

std::string full_name(const c10::OperatorHandle& op) {
  const auto& n = op.operator_name();
  return n.name + (n.overload_name.empty() ? "" : "." + n.overload_name);
}

void warn_once(const std::string& name) {
  {
    std::lock_guard<std::mutex> g(g_mu);
    if (!g_warned->insert(name).second) return;
  }
  // A c10 log line on stderr, as torch_npu prints it (not a Python warning).
  static c10::WarningHandler base_handler;
  base_handler.process(c10::Warning(
      c10::UserWarning(), {"npu_cpu_fallback", "VariableFallbackKernel.cpp", 97},
      "CAUTION: The operator '" + name +
          "' is not currently supported on the NPU backend and will fall back to run on the CPU. This may have "
          "performance implications.",
      false));
  log::emit(log::DISPATCH, log::WARNING, "operator " + name + " falls back to the CPU (first call)");
}

// The host copy of an argument: same sizes and strides as the device
// tensor, so the CPU kernel sees the caller's layout and keeps a mutated
// (out=, in-place) argument's strides exactly where it keeps a CPU tensor's
// (a clone would make a non-contiguous out= contiguous). Tensors with
// internal overlap (expanded) cannot be written by copy_: those are cloned.
at::Tensor host_copy_keeping_strides(const at::Tensor& t) {
  at::Tensor src = cpu_alias(t);
  if (at::has_internal_overlap(src) == at::MemOverlap::Yes) return src.clone(at::MemoryFormat::Preserve);
  at::Tensor host = at::empty_strided(src.sizes(), src.strides(), src.options());
  host.copy_(src);
  return host;
}

struct Moved {
  at::Tensor npu;
  at::Tensor cpu;
  bool written;
};

}  // namespace

void emulated_cpu_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  const std::string name = full_name(op);
  TORCH_CHECK(!fallback_disabled(), "The operator '", name,
              "' would execute its main computation on CPU through dispatcher backend fallback because no kernel "
              "is registered for the NPU PrivateUse1 backend, but CPU fallback is disabled by "
              "TORCH_NPU_FALLBACK_CPU_DISABLE=1.",
              OPS_ERROR(ErrCode::NOT_SUPPORT));
  warn_once(name);

  const auto t0 = std::chrono::steady_clock::now();
  int64_t to_cpu = 0, to_npu = 0;
  c10::SmallVector<Moved, 8> moved;
  // The observer sees the whole fallback, copies included: that is its cost.
  // The device is not known before the arguments are checked.
  KernelObserver* obs = kernel_observer();
  if (obs) obs->on_kernel_begin(op, -1);

  // Real copies to host memory (plain CPU tensors, not aliases).
  const int device = prepare_cpu_call(op, stack, [&](const at::Tensor& t, const c10::Argument& arg) -> at::Tensor {
    const bool written = arg.alias_info() != nullptr && arg.alias_info()->isWrite();
    // The same tensor passed twice gets one host copy (the kernel must see an in-place call).
    for (auto& m : moved) {
      if (m.npu.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) {
        m.written = m.written || written;
        return m.cpu;
      }
    }
    at::Tensor host = host_copy_keeping_strides(t);
    to_cpu += static_cast<int64_t>(t.numel() * t.element_size());
    moved.push_back({t, host, written});
    return host;
  });

  // The kernel runs on host memory: no device-memory scope.
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);

  // Mutated arguments: copy back into the caller's tensor. Its strides stay
  // unless the kernel resized or restrided the host copy (which had them):
  // then the device tensor takes the same geometry at its own storage
  // offset, as the CPU kernel's resize would give the caller's tensor.
  for (auto& m : moved) {
    if (!m.written) continue;
    if (m.npu.sizes() != m.cpu.sizes() || m.npu.strides() != m.cpu.strides()) {
      m.npu.set_(m.npu.storage(), m.npu.storage_offset(), m.cpu.sizes(), m.cpu.strides());
    }
    cpu_alias(m.npu).copy_(m.cpu);
    to_npu += static_cast<int64_t>(m.cpu.numel() * m.cpu.element_size());
  }

  auto back = [&](const at::Tensor& r) -> at::Tensor {
    if (!r.defined()) return r;
    for (auto& m : moved) {
      if (m.cpu.is_same(r)) return m.npu;
    }
    if (!r.is_cpu()) return r;
    at::Tensor out = at::detail::empty_strided_generic(r.sizes(), r.strides(), allocator::get(device),
                                                       c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                                       r.scalar_type());
    cpu_alias(out).copy_(r);
    to_npu += static_cast<int64_t>(r.numel() * r.element_size());
    return out;
  };
  const size_t nret = op.schema().returns().size();
  for (size_t i = stack->size() - nret; i < stack->size(); ++i) {
    c10::IValue& iv = (*stack)[i];
    if (iv.isTensor()) {
      iv = back(iv.toTensor());
    } else if (iv.isTensorList()) {
      c10::List<at::Tensor> out;
      for (const at::Tensor& t : iv.toTensorList()) out.push_back(back(t));
      iv = std::move(out);
    }
  }

  if (obs) obs->on_kernel_end(op, device, KernelInfo{true, to_cpu + to_npu});
  std::lock_guard<std::mutex> g(g_mu);
  auto& s = (*g_stats)[name];
  s.calls += 1;
  s.bytes_to_cpu += to_cpu;
  s.bytes_to_npu += to_npu;
  s.ns += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
}

std::vector<std::pair<std::string, FallbackStats>> fallback_stats() {
  std::lock_guard<std::mutex> g(g_mu);
  return {g_stats->begin(), g_stats->end()};
}

void reset_fallback_stats() {
  std::lock_guard<std::mutex> g(g_mu);
  g_stats->clear();
}

}  // namespace torch_npu::exec
