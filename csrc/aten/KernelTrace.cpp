// Kernel launch start/finish for the trace hooks' kernel mode
// (torch_npu._C._activate_npu_trace(1)): an observer of the execution layer
// that reports each npu kernel by its operator name.
#include <string>

#include "aten/OpExecution.h"
#include "core/NPUTrace.h"

namespace torch_npu::exec {
namespace {

std::string op_name(const c10::OperatorHandle& op) {
  const auto& n = op.schema().operator_name();
  return n.overload_name.empty() ? n.name : n.name + "." + n.overload_name;
}

class KernelTraceObserver final : public KernelObserver {
 public:
  void on_kernel_begin(const c10::OperatorHandle& op, int) override {
    if (trace::kernel_hooks_on()) trace::fire_kernel(trace::Kind::AclStartExecution, op_name(op));
  }
  void on_kernel_end(const c10::OperatorHandle& op, int, const KernelInfo&) override {
    if (trace::kernel_hooks_on()) trace::fire_kernel(trace::Kind::AclFinishExecution, op_name(op));
  }
};

KernelTraceObserver g_kernel_trace;

}  // namespace

void enable_kernel_trace(bool on) {
  if (on) {
    add_kernel_observer(&g_kernel_trace);
  } else {
    remove_kernel_observer(&g_kernel_trace);
  }
}

}  // namespace torch_npu::exec
