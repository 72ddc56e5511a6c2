// Zero-copy op execution. An op on npu tensors runs the stock CPU kernel on
// CPU aliases of device memory (same pointer, sizes, strides; nothing is
// copied). While the kernel runs, the thread's CPU allocations are served
// from the device pool, so its outputs already live in device memory and
// only need their device label changed.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/util/FunctionRef.h>
#include <torch/library.h>

#include <string>
#include <unordered_set>
#include <vector>

namespace torch_npu::exec {

// RAII: while alive, CPU allocations made on this thread come from the pool
// of emulated device `device`.
class DeviceMemoryScope {
 public:
  explicit DeviceMemoryScope(int device);
  ~DeviceMemoryScope();
  DeviceMemoryScope(const DeviceMemoryScope&) = delete;
  DeviceMemoryScope& operator=(const DeviceMemoryScope&) = delete;

 private:
  int* slot_;  // this thread's redirect device (one thread-local lookup per scope)
  int prev_;
};

// Wraps the process CPU allocator so that DeviceMemoryScope can redirect it.
void install_cpu_allocator();

// A CPU tensor sharing `t`'s memory (t must be an npu tensor).
at::Tensor cpu_alias(const at::Tensor& t);
// The CPU storage an alias of `npu_storage` uses. Aliases of tensors that
// share an npu storage must share one alias storage within a call, so CPU
// kernels see them as aliases (memory-overlap checks, is_alias_of).
c10::Storage alias_storage(const c10::Storage& npu_storage);
at::Tensor cpu_alias(const at::Tensor& t, c10::Storage storage);
// A thread's aliases given back by finished calls, for reuse (a thread-local
// is looked up once per call: in a dlopen'ed library each lookup is a call).
using AliasPool = std::vector<c10::intrusive_ptr<c10::TensorImpl>>;
AliasPool& this_thread_alias_pool();
// cpu_alias from the pool (a new one when it is empty). `storage` is the
// call's alias of t's npu storage; when empty, one is made (or the pooled
// alias's own one is pointed at t's memory) and returned through it.
// `inference` is c10::InferenceMode::is_enabled() (a call reads it once).
at::Tensor pooled_cpu_alias(AliasPool& pool, const at::Tensor& t, c10::Storage& storage, bool inference);
// Gives an alias back to the pool when nothing else holds it and the kernel
// left it a plain alias; otherwise it is simply released.
void recycle_cpu_alias(AliasPool& pool, at::Tensor&& alias);
// An npu tensor on `device` for a CPU tensor produced inside a
// DeviceMemoryScope(device); zero-copy when the memory came from the pool.
at::Tensor adopt_result(const at::Tensor& cpu_result, int device);
// The same for a result nobody else holds: its TensorImpl becomes the npu
// tensor (no second TensorImpl), when it is a plain strided CPU tensor.
at::Tensor adopt_result_in_place(at::Tensor cpu_result, int device);
// Like adopt_result, but the CPU tensor stays valid: a pool-backed storage
// is shared (the npu storage keeps the CPU one alive), anything else copied.
at::Tensor share_result(const at::Tensor& cpu_result, int device);
// Pieces of adopt_result: move a pool-backed CPU storage to an npu storage
// (or copy it into the pool if it is not pool-backed), and build an npu
// tensor over a storage with another tensor's sizes, strides and offset.
c10::Storage adopt_storage(c10::StorageImpl* cpu_storage, int device);
at::Tensor npu_tensor_like(c10::Storage storage, const at::Tensor& geometry);

// Prepares a boxed call's arguments for a CPU kernel, for both boxed npu
// kernels (zero-copy and emulated fallback): checks devices as torch_npu
// does, replaces each npu tensor by to_cpu(tensor, argument), npu devices by
// cpu, and the generator by a CPU engine drawn from the npu generator.
// Returns the npu device index of the call.
int prepare_cpu_call(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                     c10::function_ref<at::Tensor(const at::Tensor&, const c10::Argument&)> to_cpu);

// The boxed kernel used for every ATen op without a dedicated npu kernel.
void npu_cpu_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack);
// The same, with `before_cpu_kernel(stack, first_arg)` run inside the kernel
// scope on the prepared CPU arguments (stack[first_arg...]) just before the
// CPU kernel; it may replace input arguments (chip numerics rounds them).
void npu_cpu_kernel_with(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                         c10::function_ref<void(torch::jit::Stack*, size_t)> before_cpu_kernel);

// Registers kernels explicitly, op by op, at import:
// - the zero-copy boxed kernel for ops that have both a CPU kernel and a
//   Composite kernel (the composite one would otherwise win for PrivateUse1:
//   an extra dispatch and allocation, or a different result);
// - the emulated torch_npu CPU fallback for ops with only a CPU kernel that
//   are not in `native_ops` (the real torch_npu's NPU kernel list).
struct KernelRegistration {
  int zero_copy_explicit = 0;
  int emulated_fallback = 0;
  int unboxed = 0;
};
KernelRegistration register_explicit_cpu_kernels(const std::unordered_set<std::string>& native_ops);
// Whether an op has a CPU kernel and a composite one: register_explicit_cpu_kernels
// gives it the zero-copy kernel whether or not torch_npu lists it as native.
bool runs_zero_copy_as_composite(const c10::OperatorHandle& op);
// The unboxed zero-copy kernels of the hottest ops (aten/UnboxedKernels.cpp),
// for those of them in `native_ops` that have no npu kernel yet. Returns how many.
int register_unboxed_kernels(torch::Library& lib, const std::unordered_set<std::string>& native_ops);

// One hook in the execution layer. Later layers (CPU-fallback emulation,
// profiler device timeline) observe each kernel through it. Called on the
// executing thread around the CPU kernel; `device` is the npu index.
struct KernelInfo {
  bool fallback = false;     // ran through the emulated CPU fallback
  int64_t bytes_copied = 0;  // fallback only: bytes copied host<->device
};
struct KernelObserver {
  virtual ~KernelObserver() = default;
  virtual void on_kernel_begin(const c10::OperatorHandle& op, int device) = 0;
  virtual void on_kernel_end(const c10::OperatorHandle& op, int device, const KernelInfo& info) = 0;
};
// Several layers may observe at once (the profiler timeline, later a
// tracer): observers are added and removed independently. With none, the
// execution layer pays one relaxed atomic load per kernel.
void add_kernel_observer(KernelObserver* observer);
void remove_kernel_observer(KernelObserver* observer);
// What the execution layer calls: nullptr when nobody observes.
KernelObserver* kernel_observer();
// The trace hooks' kernel mode (aten/KernelTrace.cpp): observe every kernel
// and report its start and finish to core/NPUTrace.
void enable_kernel_trace(bool on);

// What every npu kernel body runs inside: CPU allocations go to the device
// pool and the kernel observer sees the kernel. Used by the boxed path and
// by the direct kernels (through NPU_KERNEL_SCOPE).
class KernelScope {
 public:
  KernelScope(const c10::OperatorHandle& op, int device);
  ~KernelScope();
  KernelScope(const KernelScope&) = delete;
  KernelScope& operator=(const KernelScope&) = delete;

 private:
  DeviceMemoryScope memory_;
  const c10::OperatorHandle& op_;
  int device_;
  KernelObserver* observer_;
};

c10::OperatorHandle find_op(const char* name, const char* overload);

}  // namespace torch_npu::exec

#define NPU_KERNEL_SCOPE(name, overload, device)                                               \
  static const c10::OperatorHandle npu_kernel_op_ = ::torch_npu::exec::find_op(name, overload); \
  ::torch_npu::exec::KernelScope npu_kernel_scope_(npu_kernel_op_, device)

namespace torch_npu::exec {

}  // namespace torch_npu::exec
