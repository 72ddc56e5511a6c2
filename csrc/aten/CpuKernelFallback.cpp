// The boxed kernel behind every ATen op that has no dedicated npu kernel:
// validate devices, alias npu arguments as CPU tensors, run the CPU kernel
// with allocations served from the device pool, and hand results back as
// npu tensors. Nothing is copied.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/op_registration/op_registration.h>
#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include <atomic>
#include <sstream>

#include "aten/EmulatedCpuFallback.h"
#include "aten/OpExecution.h"
#include "core/NPUException.h"
#include "core/NPUGenerator.h"
#include "runtime/AclRuntime.h"

#include <algorithm>
#include <mutex>
#include <vector>

namespace torch_npu::exec {
namespace {

// Fans one kernel event out to every registered observer. The list is
// copy-on-write; replaced lists are leaked on purpose (a kernel running on
// another thread may still read one; changes are rare).
class ObserverList final : public KernelObserver {
 public:
  explicit ObserverList(std::vector<KernelObserver*> observers) : observers_(std::move(observers)) {}
  void on_kernel_begin(const c10::OperatorHandle& op, int device) override {
    for (auto* o : observers_) o->on_kernel_begin(op, device);
  }
  void on_kernel_end(const c10::OperatorHandle& op, int device, const KernelInfo& info) override {
    for (auto it = observers_.rbegin(); it != observers_.rend(); ++it) (*it)->on_kernel_end(op, device, info);
  }
  const std::vector<KernelObserver*>& observers() const { return observers_; }

 private:
  std::vector<KernelObserver*> observers_;
};

std::mutex g_observer_mu;
std::atomic<ObserverList*> g_observer{nullptr};

void publish_observers(std::vector<KernelObserver*> observers) {
  g_observer.store(observers.empty() ? nullptr : new ObserverList(std::move(observers)));
}

struct AliasEntry {
  at::Tensor orig;
  at::Tensor alias;
  bool written;
};

struct StorageEntry {
  c10::StorageImpl* cpu;
  c10::Storage npu;
};

struct AliasStorage {
  c10::StorageImpl* npu;
  c10::Storage alias;
};

// Ops whose CUDA kernels accept CPU index tensors next to device tensors.
bool accepts_cpu_indices(const c10::OperatorName& name) {
  const std::string& n = name.name;
  return n == "aten::index" || n == "aten::index_put_" || n == "aten::index_put" || n == "aten::_index_put_impl_" ||
         n == "aten::_unsafe_index" || n == "aten::_unsafe_index_put";
}

std::string wrapper_name(const c10::OperatorName& name) {
  std::string base = name.name.substr(name.name.find("::") + 2);
  return "wrapper_NPU__" + base + (name.overload_name.empty() ? "" : "_" + name.overload_name);
}

std::string device_str(const at::Device& d) {
  std::ostringstream os;
  os << d;
  return os.str();
}

struct DeviceTracker {
  const c10::OperatorHandle& op;
  bool index_op;
  int npu_device = -1;
  bool cpu_self = false;
  std::optional<at::Device> common;

  void see(const at::Tensor& t, const c10::Argument& arg) {
    at::Device d = t.device();
    if (d.type() == c10::DeviceType::PrivateUse1) {
      if (npu_device < 0) npu_device = d.index();
      TORCH_CHECK_INDEX(!(index_op && cpu_self),
                        "indices should be either on cpu or on the same device as the indexed tensor (cpu)");
    } else if (d.is_cpu() && t.dim() == 0) {
      return;  // CPU scalar inputs are fine, as on CUDA (CPU out= tensors were rejected before)
    } else if (d.is_cpu() && index_op) {
      // CPU index tensors (and values) are fine next to an npu tensor, as
      // on CUDA; a CPU tensor being indexed is not.
      if (arg.name() == "self") cpu_self = true;
      return;
    }
    if (!common) {
      common = d;
    } else if (*common != d) {
      TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, ",
                  device_str(*common), " and ", device_str(d), "! (when checking argument for argument ", arg.name(),
                  " in method ", wrapper_name(op.operator_name()), ")");
    }
  }
};

bool is_written(const c10::Argument& arg) { return arg.alias_info() != nullptr && arg.alias_info()->isWrite(); }

// CPU 0-dim tensors are accepted as inputs next to npu tensors, as on CUDA.
bool exempt_cpu_scalar(const at::Tensor& t, const c10::Argument& arg) {
  return t.device().is_cpu() && t.dim() == 0 && !is_written(arg);
}

// The error for an out= (or in-place) argument on the CPU next to npu
// tensors, worded and ordered as the generated device check of the real
// torch_npu and CUDA wrappers: out arguments first, then the positional ones;
// the first tensor sets the common device, the first that differs is named.
// Runs before any argument is replaced by a CPU alias. Cold path.
[[noreturn]] void out_device_error(const c10::OperatorHandle& op, const torch::jit::Stack& stack, size_t base) {
  const auto& args = op.schema().arguments();
  std::vector<size_t> order;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].kwarg_only() && is_written(args[i])) order.push_back(i);
  }
  for (size_t i = 0; i < args.size(); ++i) {
    if (!args[i].kwarg_only()) order.push_back(i);
  }
  std::optional<at::Device> common;
  for (size_t i : order) {
    const c10::IValue& iv = stack[base + i];
    std::vector<at::Tensor> tensors;
    if (iv.isTensor()) {
      tensors.push_back(iv.toTensor());
    } else if (iv.isTensorList()) {
      for (const at::Tensor& t : iv.toTensorList()) tensors.push_back(t);
    }
    for (const at::Tensor& t : tensors) {
      if (!t.defined() || exempt_cpu_scalar(t, args[i])) continue;
      if (!common) {
        common = t.device();
      } else if (*common != t.device()) {
        TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, ",
                    device_str(*common), " and ", device_str(t.device()),
                    "! (when checking argument for argument ", args[i].name(), " in method ",
                    wrapper_name(op.operator_name()), ")");
      }
    }
  }
  TORCH_CHECK(false, "Expected out tensor to have device npu, but got cpu instead (in method ",
              wrapper_name(op.operator_name()), ")");
}

bool is_generator_arg(const c10::Argument& arg) {
  const auto& type = arg.type();
  if (type->kind() == c10::TypeKind::GeneratorType) return true;
  if (type->kind() == c10::TypeKind::OptionalType) {
    return type->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::GeneratorType;
  }
  return false;
}

[[noreturn]] void unsupported(const c10::OperatorHandle& op) {
  const auto& n = op.operator_name();
  TORCH_CHECK_NOT_IMPLEMENTED(false, "CAUTION: The operator '", n.name,
                              n.overload_name.empty() ? "" : "." + n.overload_name,
                              "' is not currently supported on the NPU backend.", OPS_ERROR(ErrCode::NOT_SUPPORT));
}

}  // namespace

void add_kernel_observer(KernelObserver* observer) {
  std::lock_guard<std::mutex> g(g_observer_mu);
  ObserverList* cur = g_observer.load();
  std::vector<KernelObserver*> next = cur ? cur->observers() : std::vector<KernelObserver*>{};
  if (std::find(next.begin(), next.end(), observer) != next.end()) return;
  next.push_back(observer);
  publish_observers(std::move(next));
}

void remove_kernel_observer(KernelObserver* observer) {
  std::lock_guard<std::mutex> g(g_observer_mu);
  ObserverList* cur = g_observer.load();
  if (!cur) return;
  std::vector<KernelObserver*> next = cur->observers();
  next.erase(std::remove(next.begin(), next.end(), observer), next.end());
  publish_observers(std::move(next));
}

KernelObserver* kernel_observer() { return g_observer.load(std::memory_order_relaxed); }

KernelScope::KernelScope(const c10::OperatorHandle& op, int device)
    : memory_(device), op_(op), device_(device), observer_(kernel_observer()) {
  if (observer_) observer_->on_kernel_begin(op_, device_);
}

KernelScope::~KernelScope() {
  if (observer_) observer_->on_kernel_end(op_, device_, KernelInfo{});
}

c10::OperatorHandle find_op(const char* name, const char* overload) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
}

int prepare_cpu_call(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                     c10::function_ref<at::Tensor(const at::Tensor&, const c10::Argument&)> to_cpu) {
  const auto& args = op.schema().arguments();
  const size_t nargs = args.size();
  const size_t base = stack->size() - nargs;
  DeviceTracker tracker{op, accepts_cpu_indices(op.operator_name())};
  int gen_arg = -1;
  int64_t first_numel = -1;

  // out= (and in-place) tensors must be on the npu, 0-dim ones included:
  // checked before any argument is converted. Index ops keep their own
  // rule (a CPU indexed tensor is reported by the tracker, as on CUDA).
  if (!tracker.index_op) {
    for (size_t i = 0; i < nargs; ++i) {
      if (!is_written(args[i])) continue;
      const c10::IValue& iv = (*stack)[base + i];
      if (iv.isTensor() && iv.toTensor().defined() && iv.toTensor().device().is_cpu()) {
        out_device_error(op, *stack, base);
      }
    }
  }

  auto convert = [&](const at::Tensor& t, const c10::Argument& arg) -> at::Tensor {
    tracker.see(t, arg);
    if (t.device().type() != c10::DeviceType::PrivateUse1) return t;
    if (first_numel < 0) first_numel = t.numel();
    return to_cpu(t, arg);
  };

  for (size_t i = 0; i < nargs; ++i) {
    c10::IValue& iv = (*stack)[base + i];
    if (iv.isTensor()) {
      const at::Tensor& t = iv.toTensor();
      if (t.defined()) iv = convert(t, args[i]);
    } else if (iv.isTensorList()) {
      auto list = iv.toTensorList();
      c10::List<at::Tensor> out;
      out.reserve(list.size());
      for (const at::Tensor& t : list) out.push_back(t.defined() ? convert(t, args[i]) : t);
      iv = std::move(out);
    } else if (iv.isList() && iv.toListRef().size() > 0 && (iv.toListRef()[0].isTensor() || iv.toListRef()[0].isNone())) {
      // Tensor?[] (e.g. index's indices)
      auto list = iv.toOptionalTensorList();
      c10::List<std::optional<at::Tensor>> out;
      out.reserve(list.size());
      for (std::optional<at::Tensor> t : list) {
        if (t.has_value() && t->defined()) {
          out.push_back(convert(*t, args[i]));
        } else {
          out.push_back(std::move(t));
        }
      }
      iv = std::move(out);
    } else if (iv.isDevice()) {
      at::Device d = iv.toDevice();
      if (d.type() == c10::DeviceType::PrivateUse1) {
        if (tracker.npu_device < 0) tracker.npu_device = d.has_index() ? d.index() : -1;
        iv = c10::IValue(at::Device(c10::DeviceType::CPU));
      }
    } else if (iv.isGenerator() || (iv.isNone() && is_generator_arg(args[i]))) {
      gen_arg = static_cast<int>(i);
    }
  }

  int device = tracker.npu_device;
  if (device < 0) device = acl_emu::current_device_or_default();

  if (gen_arg >= 0) {
    c10::IValue& iv = (*stack)[base + gen_arg];
    at::Generator gen = iv.isGenerator() ? iv.toGenerator() : default_generator(static_cast<c10::DeviceIndex>(device));
    TORCH_CHECK(gen.device().type() == c10::DeviceType::PrivateUse1,
                "Expected a 'npu' device type for generator but found '", gen.device().type(), "'");
    iv = gen.get<NPUGeneratorImpl>()->engine_for_op(first_numel);
  }
  return device;
}

namespace {

// The boxed npu kernel's body; `before_cpu_kernel(stack, first_arg)` runs
// inside the kernel scope on the CPU arguments, just before the CPU kernel.
// A template, so the plain kernel's empty hook costs nothing.
template <class BeforeCpuKernel>
void run_boxed_cpu_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                          BeforeCpuKernel&& before_cpu_kernel) {
  c10::SmallVector<AliasEntry, 8> aliases;
  c10::SmallVector<AliasStorage, 8> alias_storages;

  const int device = prepare_cpu_call(op, stack, [&](const at::Tensor& t, const c10::Argument& arg) -> at::Tensor {
    // The same tensor passed twice (x.op_(y) calling op.out(x, y, out=x))
    // must be the same alias, so the CPU kernel sees an in-place call
    // (TensorIterator then refuses to resize it, as on CPU).
    for (auto& e : aliases) {
      if (e.orig.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) {
        e.written = e.written || is_written(arg);
        return e.alias;
      }
    }
    // Aliases of one npu storage share one CPU storage (overlap checks).
    c10::StorageImpl* npu_storage = t.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl();
    c10::Storage shared;
    for (auto& as : alias_storages) {
      if (as.npu == npu_storage) shared = as.alias;
    }
    if (!shared) {
      shared = alias_storage(t.unsafeGetTensorImpl()->unsafe_storage());
      alias_storages.push_back({npu_storage, shared});
    }
    at::Tensor a = cpu_alias(t, std::move(shared));
    aliases.push_back({t, a, is_written(arg)});
    return a;
  });

  {
    KernelScope scope(op, device);
    before_cpu_kernel(stack, stack->size() - op.schema().arguments().size());
    try {
      op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
    } catch (const c10::NotImplementedError&) {
      if (!op.hasKernelForDispatchKey(c10::DispatchKey::CPU)) unsupported(op);
      throw;
    }
  }

  // Write back metadata changes (resize, set_) of mutated arguments.
  for (auto& e : aliases) {
    if (!e.written) continue;
    c10::TensorImpl* oi = e.orig.unsafeGetTensorImpl();
    c10::TensorImpl* ai = e.alias.unsafeGetTensorImpl();
    c10::StorageImpl* as = ai->unsafe_storage().unsafeGetStorageImpl();
    c10::StorageImpl* os = oi->unsafe_storage().unsafeGetStorageImpl();
    if (as->data() != os->data() || as->nbytes() != os->nbytes()) {
      c10::Storage fresh = adopt_storage(as, device);
      c10::DataPtr dp = fresh.unsafeGetStorageImpl()->set_data_ptr(c10::DataPtr());
      os->set_data_ptr_noswap(std::move(dp));
      os->set_nbytes(fresh.nbytes());
      // Keep the alias pointing at the (moved) memory for view outputs.
      as->set_data_ptr_noswap(c10::DataPtr(os->mutable_data(), c10::Device(c10::DeviceType::CPU)));
    }
    if (ai->sizes() != oi->sizes() || ai->strides() != oi->strides() ||
        ai->storage_offset() != oi->storage_offset()) {
      oi->set_sizes_and_strides(ai->sizes(), ai->strides(), ai->storage_offset());
    }
  }

  // Hand results back as npu tensors.
  c10::SmallVector<StorageEntry, 4> storages;
  auto to_npu = [&](const at::Tensor& r) -> at::Tensor {
    if (!r.defined()) return r;
    const c10::TensorImpl* ri = r.unsafeGetTensorImpl();
    for (auto& e : aliases) {
      if (e.alias.unsafeGetTensorImpl() == ri) return e.orig;
    }
    if (r.layout() != c10::kStrided || r.is_quantized() || !r.has_storage()) unsupported(op);
    if (!r.is_cpu()) return r;  // e.g. a meta or already-npu result
    c10::StorageImpl* s = ri->unsafe_storage().unsafeGetStorageImpl();
    for (auto& e : aliases) {
      if (e.alias.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl() == s) {
        return npu_tensor_like(e.orig.storage(), r);
      }
    }
    for (auto& se : storages) {
      if (se.cpu == s) return npu_tensor_like(se.npu, r);
    }
    c10::Storage npu = adopt_storage(s, device);
    storages.push_back({s, npu});
    return npu_tensor_like(std::move(npu), r);
  };

  const size_t nret = op.schema().returns().size();
  for (size_t i = stack->size() - nret; i < stack->size(); ++i) {
    c10::IValue& iv = (*stack)[i];
    if (iv.isTensor()) {
      iv = to_npu(iv.toTensor());
    } else if (iv.isTensorList()) {
      auto list = iv.toTensorList();
      c10::List<at::Tensor> out;
      out.reserve(list.size());
      for (const at::Tensor& t : list) out.push_back(to_npu(t));
      iv = std::move(out);
    }
  }
}

}  // namespace

void npu_cpu_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  run_boxed_cpu_kernel(op, stack, [](torch::jit::Stack*, size_t) {});
}

void npu_cpu_kernel_with(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                         c10::function_ref<void(torch::jit::Stack*, size_t)> before_cpu_kernel) {
  run_boxed_cpu_kernel(op, stack, before_cpu_kernel);
}

bool runs_zero_copy_as_composite(const c10::OperatorHandle& op) {
  // Also the few ops with a CPU kernel and a CompositeImplicitAutograd one
  // (mish_backward, native_channel_shuffle): CPU runs its kernel, so npu must too.
  return op.hasKernelForDispatchKey(c10::DispatchKey::CPU) &&
         (op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) ||
          op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional) ||
          op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd));
}

KernelRegistration register_explicit_cpu_kernels(const std::unordered_set<std::string>& native_ops) {
  static torch::Library* lib = nullptr;
  static KernelRegistration counts;
  if (lib != nullptr) return counts;
  lib = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  // addr_ has only a composite kernel, which calls addr_out(self, self, ...) and
  // tells in-place from out= by reference identity (&result == &self). On npu
  // that composite would call the boxed addr_out, whose two stack slots are
  // never the same reference, so a non-2-D self would be resized instead of
  // rejected. Running the composite itself on the CPU alias keeps the identity.
  lib->impl("addr_", torch::CppFunction::makeFromBoxedFunction<&npu_cpu_kernel>());
  ++counts.zero_copy_explicit;
  counts.unboxed = register_unboxed_kernels(*lib, native_ops);
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const auto& name : dispatcher.getAllOpNames()) {
    auto op = dispatcher.findOp(name);
    if (!op) continue;
    if (name.name.rfind("aten::", 0) != 0) continue;
    if (!op->hasKernelForDispatchKey(c10::DispatchKey::CPU)) continue;
    if (op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) continue;
    std::string full = name.name.substr(6) + (name.overload_name.empty() ? "" : "." + name.overload_name);
    if (runs_zero_copy_as_composite(*op)) {
      lib->impl(full.c_str(), torch::CppFunction::makeFromBoxedFunction<&npu_cpu_kernel>());
      ++counts.zero_copy_explicit;
      continue;
    }
    // Would reach the backend fallback. On hardware, ops without an NPU
    // kernel go through torch_npu's CPU fallback; emulate it. View-returning
    // ops stay zero-copy (a copy cannot be a view).
    if (native_ops.count(full) > 0) continue;
    bool returns_alias = false;
    for (const auto& ret : op->schema().returns()) {
      if (ret.alias_info() != nullptr && !ret.alias_info()->isWrite()) returns_alias = true;
    }
    if (returns_alias) continue;
    lib->impl(full.c_str(), torch::CppFunction::makeFromBoxedFunction<&emulated_cpu_fallback>());
    ++counts.emulated_fallback;
  }
  return counts;
}

}  // namespace torch_npu::exec

// Everything without a dedicated kernel runs the CPU kernel zero-copy.
TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&torch_npu::exec::npu_cpu_kernel>());
}

namespace {
void sparse_unsupported(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack*) {
  const auto& n = op.operator_name();
  TORCH_CHECK_NOT_IMPLEMENTED(false, "CAUTION: The operator '", n.name,
                              n.overload_name.empty() ? "" : "." + n.overload_name,
                              "' is not currently supported on the NPU backend.",
                              torch_npu::OPS_ERROR(torch_npu::ErrCode::NOT_SUPPORT));
}
}  // namespace

// Sparse (COO and compressed) npu tensors are not supported by torch_npu: a
// clear error, no fallback.
TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&sparse_unsupported>());
}

TORCH_LIBRARY_IMPL(_, SparseCsrPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&sparse_unsupported>());
}
