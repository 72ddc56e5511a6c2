// Unboxed zero-copy kernels for the ops client code calls most (elementwise
// math, reductions, matmuls, softmax, layer norm...). They do what the boxed
// kernel (CpuKernelFallback.cpp) does, without its boxing: no IValue stack,
// no walk over the schema, no second boxed/unboxed conversion on the way to
// the CPU kernel. Per op that is about a third of the npu-over-CPU cost.
//
// A call takes this path when every tensor argument is an npu tensor of one
// device (CPU 0-dim tensors may be read, as on CUDA). Anything else (a CPU
// tensor, two devices) goes to the boxed kernel, which raises the device
// errors with their real texts.
#include <ATen/core/boxing/KernelFunction.h>
#include <ATen/core/boxing/impl/boxing.h>
#include <ATen/Operators.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <unordered_set>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "aten/Dropout.h"
#include "aten/OpExecution.h"

namespace torch_npu::exec {
namespace {

// One call's argument checks and CPU aliases. Aliases of one npu tensor are
// one alias; aliases of one npu storage share one CPU storage, so the CPU
// kernel sees what aliases what (overlap checks), as on the boxed path.
struct Call {
  int device = -1;
  // (npu tensor, its CPU alias). The npu tensor is held by address, not
  // copied: a copy of a tensor Python owns increfs (and later decrefs) its
  // PyObject, each time taking the GIL the binding released. The arguments
  // outlive the call.
  c10::SmallVector<std::pair<const at::Tensor*, at::Tensor>, 4> aliases;
  c10::SmallVector<std::pair<c10::StorageImpl*, c10::Storage>, 4> storages;
  AliasPool* pool = nullptr;
  bool inference = false;  // InferenceMode::is_enabled(), read with the pool

  // Out of line (as are alias, result and the destructor): one copy of the
  // shared work, not one per op's kernel, keeps the hot code small.
  C10_NOINLINE bool accepts(const at::Tensor& t, bool written) {
    if (!t.defined()) return true;
    const at::Device d = t.device();
    if (d.type() == c10::DeviceType::PrivateUse1) {
      if (device < 0) {
        device = d.index();
      } else if (device != d.index()) {
        return false;
      }
      return true;
    }
    return !written && d.is_cpu() && t.dim() == 0;
  }

  C10_NOINLINE at::Tensor alias(const at::Tensor& t) {
    if (!t.defined() || t.device().type() != c10::DeviceType::PrivateUse1) return t;
    const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
    for (auto& a : aliases) {
      if (a.first->unsafeGetTensorImpl() == impl) return a.second;
    }
    c10::StorageImpl* npu = impl->unsafe_storage().unsafeGetStorageImpl();
    c10::Storage shared;
    for (auto& s : storages) {
      if (s.first == npu) shared = s.second;
    }
    const bool made = !shared;
    if (pool == nullptr) {
      pool = &this_thread_alias_pool();
      inference = c10::InferenceMode::is_enabled();
    }
    at::Tensor a = pooled_cpu_alias(*pool, t, shared, inference);
    if (made) storages.emplace_back(npu, std::move(shared));
    aliases.emplace_back(&t, a);
    return a;
  }

  // The aliases go back to the thread's pool (the call's other references
  // to them, its argument tuple and results, are gone by now).
  C10_NOINLINE ~Call() {
    if (pool == nullptr) return;
    storages.clear();
    for (auto& a : aliases) recycle_cpu_alias(*pool, std::move(a.second));
  }

  // A CPU kernel result as an npu tensor: an argument returned as is is that
  // argument; a view of an argument's memory is a view of its npu storage;
  // anything else is adopted from the device pool.
  C10_NOINLINE at::Tensor result(at::Tensor r) {
    if (!r.defined() || !r.is_cpu()) return r;
    const c10::TensorImpl* ri = r.unsafeGetTensorImpl();
    for (auto& a : aliases) {
      if (a.second.unsafeGetTensorImpl() == ri) return *a.first;
    }
    const c10::StorageImpl* s = ri->unsafe_storage().unsafeGetStorageImpl();
    for (auto& a : aliases) {
      if (a.second.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl() == s) {
        return npu_tensor_like(a.first->storage(), r);
      }
    }
    return adopt_result_in_place(std::move(r), device);
  }
};

// Holds the aliases of a tensor list for the duration of the CPU call.
struct ListAliases {
  c10::SmallVector<at::Tensor, 4> tensors;  // cat's few inputs: no heap allocation
  operator at::ITensorListRef() const { return at::ITensorListRef(c10::ArrayRef<at::Tensor>(tensors)); }
};

// Per argument type: may the fast path take it, and what the CPU kernel gets.
template <class T>
struct Arg {
  static bool accepts(Call&, const T&, bool) { return true; }
  static const T& to_cpu(Call&, const T& v) { return v; }
};

template <>
struct Arg<at::Tensor> {
  static bool accepts(Call& c, const at::Tensor& t, bool written) { return c.accepts(t, written); }
  static at::Tensor to_cpu(Call& c, const at::Tensor& t) { return c.alias(t); }
};

template <>
struct Arg<std::optional<at::Tensor>> {
  static bool accepts(Call& c, const std::optional<at::Tensor>& t, bool written) {
    return !t.has_value() || c.accepts(*t, written);
  }
  static std::optional<at::Tensor> to_cpu(Call& c, const std::optional<at::Tensor>& t) {
    if (!t.has_value()) return t;
    return c.alias(*t);
  }
};

template <>
struct Arg<at::ITensorListRef> {
  static bool accepts(Call& c, const at::ITensorListRef& list, bool written) {
    for (const at::Tensor& t : list) {
      if (!c.accepts(t, written)) return false;
    }
    return true;
  }
  static ListAliases to_cpu(Call& c, const at::ITensorListRef& list) {
    ListAliases out;
    out.tensors.reserve(list.size());
    for (const at::Tensor& t : list) out.tensors.push_back(c.alias(t));
    return out;
  }
};

// Tensor?[] (index's indices): each defined element is read like a tensor.
// The elements are read in place, from the list's IValues: reading a List
// element by value yields a copy, whose address (the alias key) would die.
template <>
struct Arg<c10::List<std::optional<at::Tensor>>> {
  using List = c10::List<std::optional<at::Tensor>>;
  static c10::ArrayRef<c10::IValue> elements(const List& list) { return c10::IValue(list).toListRef(); }
  static bool accepts(Call& c, const List& list, bool) {
    for (const c10::IValue& e : elements(list)) {
      if (e.isTensor() && !c.accepts(e.toTensor(), false)) return false;
    }
    return true;
  }
  static List to_cpu(Call& c, const List& list) {
    List out;
    out.reserve(list.size());
    for (const c10::IValue& e : elements(list)) {
      out.push_back(e.isTensor() ? std::optional<at::Tensor>(c.alias(e.toTensor())) : std::nullopt);
    }
    return out;
  }
};

template <class A>
constexpr bool kWritten = std::is_same_v<A, at::Tensor&>;

// Results are moved in, so a fresh CPU result can become the npu tensor
// itself (adopt_result_in_place) instead of being copied into a new one.
template <class R>
struct Result {
  static R map(Call&, R r) { return r; }
};

template <>
struct Result<at::Tensor> {
  static at::Tensor map(Call& c, at::Tensor r) { return c.result(std::move(r)); }
};

template <class... Ts>
struct Result<std::tuple<Ts...>> {
  static std::tuple<Ts...> map(Call& c, std::tuple<Ts...> r) {
    return std::apply([&](auto&... x) { return std::tuple<Ts...>(Result<std::decay_t<decltype(x)>>::map(c, std::move(x))...); },
                      r);
  }
};

constexpr c10::DispatchKeySet kCpu(c10::DispatchKey::CPU);

// The CPU kernel an op's aliases go to: the op's own, unless an equivalent
// CPU kernel computes the same bits faster.
template <class Op>
struct CpuKernel {
  template <class... A>
  static decltype(auto) run(A&... a) {
    return Op::redispatch(kCpu, a...);
  }
};

// x[idx] with one non-empty 1-D integer index on dim 0 of a contiguous,
// non-empty x is a row gather: index_select copies whole rows, where CPU
// index goes element by element (3x slower on MoE decoding's expert-weight
// gathers). A copy has no arithmetic, and for these arguments the result's
// sizes and strides are index's (contiguous; an empty x or index is where
// they differ); anything index_select refuses (a negative index, one out of
// range) goes to index itself, which accepts or raises its own error.
template <>
struct CpuKernel<at::_ops::index_Tensor> {
  static at::Tensor run(const at::Tensor& self, const c10::List<std::optional<at::Tensor>>& indices) {
    if (indices.size() == 1 && self.dim() >= 1 && self.numel() > 0 && self.is_contiguous()) {
      const std::optional<at::Tensor> idx = indices.get(0);
      if (idx.has_value() && idx->defined() && idx->dim() == 1 && idx->numel() > 0 &&
          (idx->scalar_type() == at::kLong || idx->scalar_type() == at::kInt)) {
        try {
          return at::_ops::index_select::redispatch(kCpu, self, 0, *idx);
        } catch (const c10::Error&) {
        }
      }
    }
    return at::_ops::index_Tensor::redispatch(kCpu, self, indices);
  }
};

// Dropout's backward in one pass instead of the CPU's cast and two muls (Dropout.cpp).
template <>
struct CpuKernel<at::_ops::native_dropout_backward> {
  static at::Tensor run(const at::Tensor& grad, const at::Tensor& mask, double scale) {
    return kernels::dropout_backward_cpu(grad, mask, scale);
  }
};

template <class Op, class Schema = typename Op::schema>
struct Unboxed;

template <class Op, class Ret, class... Args>
struct Unboxed<Op, Ret(Args...)> {
  static const c10::OperatorHandle& op() {
    static const c10::OperatorHandle handle = find_op(Op::name, Op::overload_name);
    return handle;
  }

  // The boxed kernel, for calls the fast path does not take; out of line, so
  // that its argument boxing does not sit in the hot code.
  static C10_NOINLINE Ret boxed(c10::DispatchKeySet ks, Args... args) {
    return c10::impl::BoxedKernelWrapper<Ret(Args...)>::call(c10::BoxedKernel::makeFromFunction<&npu_cpu_kernel>(),
                                                             op(), ks, std::forward<Args>(args)...);
  }

  static Ret call(c10::DispatchKeySet ks, Args... args) {
    Call c;
    const bool fast = (Arg<std::decay_t<Args>>::accepts(c, args, kWritten<Args>) && ...) && c.device >= 0;
    if (C10_UNLIKELY(!fast)) return boxed(ks, std::forward<Args>(args)...);
    auto cpu_args = std::tuple<decltype(Arg<std::decay_t<Args>>::to_cpu(c, args))...>(
        Arg<std::decay_t<Args>>::to_cpu(c, args)...);
    if constexpr (std::is_same_v<Ret, at::Tensor&>) {
      // in-place: the CPU kernel writes through the alias of self; self is returned
      {
        KernelScope scope(op(), c.device);
        std::apply([&](auto&... a) { CpuKernel<Op>::run(a...); }, cpu_args);
      }
      return std::get<0>(std::forward_as_tuple(args...));
    } else {
      std::decay_t<Ret> r;
      {
        KernelScope scope(op(), c.device);
        r = std::apply([&](auto&... a) { return CpuKernel<Op>::run(a...); }, cpu_args);
      }
      return Result<std::decay_t<Ret>>::map(c, std::move(r));
    }
  }

  static torch::CppFunction kernel() { return torch::CppFunction::makeFromUnboxedFunction(TORCH_FN(call)); }
};

struct Entry {
  const char* name;  // "op.overload" as in the native op list
  torch::CppFunction (*kernel)();
};

#define NPU_UNBOXED(NAME, OP) Entry{NAME, &Unboxed<at::_ops::OP>::kernel}

// The ops measured hottest in transformers' training steps and generate loops
// (bench/client_workloads.py) that run on the boxed kernel.
const Entry kEntries[] = {
    NPU_UNBOXED("add.Tensor", add_Tensor),
    NPU_UNBOXED("add_.Tensor", add__Tensor),
    NPU_UNBOXED("sub.Tensor", sub_Tensor),
    NPU_UNBOXED("sub_.Tensor", sub__Tensor),
    NPU_UNBOXED("mul.Tensor", mul_Tensor),
    NPU_UNBOXED("mul_.Tensor", mul__Tensor),
    NPU_UNBOXED("div.Tensor", div_Tensor),
    NPU_UNBOXED("div_.Tensor", div__Tensor),
    NPU_UNBOXED("div.Tensor_mode", div_Tensor_mode),
    NPU_UNBOXED("pow.Tensor_Scalar", pow_Tensor_Scalar),
    NPU_UNBOXED("pow.Tensor_Tensor", pow_Tensor_Tensor),
    NPU_UNBOXED("eq.Tensor", eq_Tensor),
    NPU_UNBOXED("eq.Scalar", eq_Scalar),
    NPU_UNBOXED("ne.Tensor", ne_Tensor),
    NPU_UNBOXED("ne.Scalar", ne_Scalar),
    NPU_UNBOXED("lt.Scalar", lt_Scalar),
    NPU_UNBOXED("lt.Tensor", lt_Tensor),
    NPU_UNBOXED("gt.Scalar", gt_Scalar),
    NPU_UNBOXED("gt.Tensor", gt_Tensor),
    NPU_UNBOXED("le.Scalar", le_Scalar),
    NPU_UNBOXED("ge.Scalar", ge_Scalar),
    NPU_UNBOXED("bitwise_or.Tensor", bitwise_or_Tensor),
    NPU_UNBOXED("bitwise_and.Tensor", bitwise_and_Tensor),
    NPU_UNBOXED("bitwise_not", bitwise_not),
    NPU_UNBOXED("logical_not", logical_not),
    NPU_UNBOXED("maximum", maximum),
    NPU_UNBOXED("minimum", minimum),
    NPU_UNBOXED("where.self", where_self),
    NPU_UNBOXED("masked_fill_.Scalar", masked_fill__Scalar),
    NPU_UNBOXED("lerp_.Scalar", lerp__Scalar),
    NPU_UNBOXED("addcmul_", addcmul_),
    NPU_UNBOXED("addcdiv_", addcdiv_),
    NPU_UNBOXED("neg", neg),
    NPU_UNBOXED("exp", exp),
    NPU_UNBOXED("log", log),
    NPU_UNBOXED("rsqrt", rsqrt),
    NPU_UNBOXED("sqrt", sqrt),
    NPU_UNBOXED("reciprocal", reciprocal),
    NPU_UNBOXED("abs", abs),
    NPU_UNBOXED("cos", cos),
    NPU_UNBOXED("sin", sin),
    NPU_UNBOXED("tanh", tanh),
    NPU_UNBOXED("sigmoid", sigmoid),
    NPU_UNBOXED("silu", silu),
    NPU_UNBOXED("relu", relu),
    NPU_UNBOXED("gelu", gelu),
    NPU_UNBOXED("sum", sum),
    NPU_UNBOXED("sum.dim_IntList", sum_dim_IntList),
    NPU_UNBOXED("mean.dim", mean_dim),
    NPU_UNBOXED("amax", amax),
    NPU_UNBOXED("max.dim", max_dim),
    NPU_UNBOXED("argmax", argmax),
    NPU_UNBOXED("any", any),
    NPU_UNBOXED("any.dim", any_dim),
    NPU_UNBOXED("cumsum", cumsum),
    NPU_UNBOXED("mm", mm),
    NPU_UNBOXED("bmm", bmm),
    NPU_UNBOXED("addmm", addmm),
    NPU_UNBOXED("baddbmm", baddbmm),
    NPU_UNBOXED("fill_.Scalar", fill__Scalar),
    NPU_UNBOXED("zero_", zero_),
    NPU_UNBOXED("cat", cat),
    NPU_UNBOXED("index_select", index_select),
    NPU_UNBOXED("index.Tensor", index_Tensor),
    NPU_UNBOXED("_softmax", _softmax),
    NPU_UNBOXED("_log_softmax", _log_softmax),
    NPU_UNBOXED("native_layer_norm", native_layer_norm),
    NPU_UNBOXED("clone", clone),
    NPU_UNBOXED("isin.Tensor_Tensor", isin_Tensor_Tensor),
    NPU_UNBOXED("topk", topk),
    NPU_UNBOXED("_scaled_dot_product_flash_attention_for_cpu", _scaled_dot_product_flash_attention_for_cpu),
    NPU_UNBOXED("_scaled_dot_product_flash_attention_for_cpu_backward", _scaled_dot_product_flash_attention_for_cpu_backward),
    NPU_UNBOXED("_softmax_backward_data", _softmax_backward_data),
    NPU_UNBOXED("_log_softmax_backward_data", _log_softmax_backward_data),
    NPU_UNBOXED("native_layer_norm_backward", native_layer_norm_backward),
    NPU_UNBOXED("silu_backward", silu_backward),
    NPU_UNBOXED("gelu_backward", gelu_backward),
    NPU_UNBOXED("threshold_backward", threshold_backward),
    NPU_UNBOXED("sigmoid_backward", sigmoid_backward),
    NPU_UNBOXED("tanh_backward", tanh_backward),
    NPU_UNBOXED("nll_loss_forward", nll_loss_forward),
    NPU_UNBOXED("nll_loss_backward", nll_loss_backward),
    NPU_UNBOXED("embedding_dense_backward", embedding_dense_backward),
    NPU_UNBOXED("max", max),
    NPU_UNBOXED("min", min),
    NPU_UNBOXED("all", all),
    NPU_UNBOXED("sort", sort),
    NPU_UNBOXED("mul.Scalar", mul_Scalar),
    NPU_UNBOXED("add.Scalar", add_Scalar),
    NPU_UNBOXED("sub.Scalar", sub_Scalar),
    NPU_UNBOXED("remainder.Scalar", remainder_Scalar),
    NPU_UNBOXED("clamp", clamp),
    NPU_UNBOXED("clamp_min", clamp_min),
    NPU_UNBOXED("triu", triu),
    NPU_UNBOXED("tril", tril),
    NPU_UNBOXED("gather", gather),
    NPU_UNBOXED("scatter_add", scatter_add),
    NPU_UNBOXED("index_add_", index_add_),
    NPU_UNBOXED("cumprod", cumprod),
    NPU_UNBOXED("logical_and", logical_and),
    NPU_UNBOXED("logical_or", logical_or),
    NPU_UNBOXED("mse_loss", mse_loss),
    NPU_UNBOXED("masked_fill.Scalar", masked_fill_Scalar),
    NPU_UNBOXED("where.ScalarOther", where_ScalarOther),
    NPU_UNBOXED("expm1", expm1),
    NPU_UNBOXED("log1p", log1p),
    NPU_UNBOXED("erf", erf),
    NPU_UNBOXED("mean", mean),
    NPU_UNBOXED("native_dropout_backward", native_dropout_backward),
    NPU_UNBOXED("native_group_norm", native_group_norm),
    NPU_UNBOXED("native_group_norm_backward", native_group_norm_backward),
};

#undef NPU_UNBOXED

}  // namespace

int register_unboxed_kernels(torch::Library& lib, const std::unordered_set<std::string>& native_ops) {
  auto& dispatcher = c10::Dispatcher::singleton();
  int n = 0;
  for (const Entry& e : kEntries) {
    const std::string full(e.name);
    const auto dot = full.find('.');
    auto op = dispatcher.findOp({"aten::" + full.substr(0, dot), dot == std::string::npos ? "" : full.substr(dot + 1)});
    if (!op || op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) continue;
    // Only where the boxed zero-copy kernel would run: an op torch_npu has an NPU
    // kernel for, or one with a CPU and a composite kernel (a structured op's
    // functional form, such as argmax or gelu, whose NPU kernel is its .out),
    // which register_explicit_cpu_kernels sends to the zero-copy kernel too.
    // The others go through the emulated CPU fallback, which copies.
    if (native_ops.count(full) == 0 && !runs_zero_copy_as_composite(*op)) continue;
    lib.impl(e.name, e.kernel());
    ++n;
  }
  return n;
}

}  // namespace torch_npu::exec
