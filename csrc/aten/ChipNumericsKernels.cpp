// Chip-numerics mode's npu kernels: the matmul and convolution families run
// their CPU kernel on the zero-copy aliases, as the default npu kernels do,
// with the product's fp32 inputs replaced by rounded copies (one elementwise
// pass each, aten/CubeInputRounding.cpp). The rounding happens inside the
// kernel scope: the copies come from the device pool, and the device
// timeline, the sanitizer and the trace hooks see one kernel that includes
// it. What each family rounds to is pushed from Python (_numerics.py), which
// owns the rules; the per-call path reads one atomic.
#include "aten/ChipNumericsKernels.h"

#include <ATen/ops/convolution.h>
#include <ATen/ops/convolution_backward.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <array>
#include <atomic>
#include <memory>
#include <mutex>

#include "aten/CubeInputRounding.h"
#include "aten/OpExecution.h"

namespace torch_npu::numerics {
namespace {

struct ChipOp {
  const char* name;         // ATen op, ".overload" when not the default
  CubeFamily family;
  std::array<int, 3> cube;  // argument positions of the product's inputs
  int ncube;
};

constexpr CubeFamily kMatmul = CubeFamily::Matmul;
constexpr CubeFamily kConv = CubeFamily::Conv;

// The ATen ops whose real kernels pass a cubeMathType to the aclnn cube op
// (docs/numerics.md); out= overloads reach the same aclnn ops.
constexpr std::array<ChipOp, 15> kOps{{
    {"mm", kMatmul, {0, 1, 0}, 2},
    {"mm.out", kMatmul, {0, 1, 0}, 2},
    {"bmm", kMatmul, {0, 1, 0}, 2},
    {"bmm.out", kMatmul, {0, 1, 0}, 2},
    {"addmm", kMatmul, {1, 2, 0}, 2},
    {"addmm_", kMatmul, {1, 2, 0}, 2},
    {"addmm.out", kMatmul, {1, 2, 0}, 2},
    {"baddbmm", kMatmul, {1, 2, 0}, 2},
    {"baddbmm_", kMatmul, {1, 2, 0}, 2},
    {"baddbmm.out", kMatmul, {1, 2, 0}, 2},
    {"addbmm", kMatmul, {1, 2, 0}, 2},
    {"addbmm_", kMatmul, {1, 2, 0}, 2},
    {"addbmm.out", kMatmul, {1, 2, 0}, 2},
    {"convolution_overrideable", kConv, {0, 1, 0}, 2},
    {"convolution_backward_overrideable", kConv, {0, 1, 2}, 3},
}};
constexpr size_t kConvForward = 13;
constexpr size_t kConvBackward = 14;
constexpr size_t kMatmulOps = 13;

struct OpCounters {
  std::atomic<int64_t> calls{0};
  std::atomic<int> kinds{0};
  std::atomic<int64_t> elements{0};
  std::atomic<int64_t> changed{0};
};
OpCounters g_counts[kOps.size()];

// Per family: -1 keeps fp32, otherwise a CubeRounding.
std::atomic<int> g_rounding[2] = {-1, -1};

int family_rounding(CubeFamily family) {
  return g_rounding[static_cast<int>(family)].load(std::memory_order_relaxed);
}

// The cube inputs of one call, rounded in place when the family rounds and
// every one of them is a float32 tensor (the CPU tensors the kernel gets).
// The same tensor passed twice is rounded once and counted twice.
struct CubeInputs {
  std::array<at::Tensor, 3> t;
  int n = 0;
  int kind = -1;  // what was applied; -1: nothing
  int64_t elements = 0;
  int64_t changed = 0;

  void round(int rounding) {
    if (rounding < 0) return;
    for (int j = 0; j < n; ++j) {
      if (!t[j].defined() || t[j].scalar_type() != at::kFloat) return;
    }
    std::array<at::Tensor, 3> rounded;
    std::array<int64_t, 3> n_changed{};
    for (int j = 0; j < n; ++j) {
      for (int k = 0; k < j; ++k) {
        if (t[k].unsafeGetTensorImpl() == t[j].unsafeGetTensorImpl()) {
          rounded[j] = rounded[k];
          n_changed[j] = n_changed[k];
        }
      }
      if (!rounded[j].defined()) {
        std::tie(rounded[j], n_changed[j]) = round_cube_input(t[j], static_cast<CubeRounding>(rounding));
      }
    }
    for (int j = 0; j < n; ++j) {
      elements += t[j].numel();
      changed += n_changed[j];
      t[j] = std::move(rounded[j]);
    }
    kind = rounding;
  }

  // Counted once the kernel has succeeded.
  void record(size_t op) const {
    if (kind < 0) return;
    OpCounters& c = g_counts[op];
    c.calls.fetch_add(1, std::memory_order_relaxed);
    c.kinds.fetch_or(1 << kind, std::memory_order_relaxed);
    c.elements.fetch_add(elements, std::memory_order_relaxed);
    c.changed.fetch_add(changed, std::memory_order_relaxed);
  }
};

// The matmul family: the default npu kernel (the boxed zero-copy one, which
// checks devices, aliases, writes back out= and in-place results), with the
// cube inputs rounded on the prepared CPU stack. The rounded copies are new
// tensors, so they never alias an out= or in-place result.
class ChipMatmulKernel final : public c10::OperatorKernel {
 public:
  explicit ChipMatmulKernel(size_t op) : op_(op) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
    const ChipOp& spec = kOps[op_];
    const int rounding = family_rounding(spec.family);
    if (rounding < 0) return exec::npu_cpu_kernel(op, ks, stack);
    CubeInputs in;
    exec::npu_cpu_kernel_with(op, stack, [&](torch::jit::Stack* s, size_t first) {
      for (int j = 0; j < spec.ncube; ++j) {
        const c10::IValue& iv = (*s)[first + spec.cube[j]];
        if (!iv.isTensor()) return;
        in.t[in.n++] = iv.toTensor();
      }
      in.round(rounding);
      if (in.kind < 0) return;
      for (int j = 0; j < in.n; ++j) (*s)[first + spec.cube[j]] = in.t[j];
    });
    in.record(op_);
  }

 private:
  size_t op_;
};

// The convolution family: DirectKernels.cpp's kernels (convolution has no
// CPU kernel at this key) with the inputs rounded inside the kernel scope.
at::Tensor chip_convolution(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                            c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation,
                            bool transposed, c10::IntArrayRef output_padding, int64_t groups) {
  const int d = input.device().index();
  std::optional<at::Tensor> b;
  if (bias.has_value() && bias->defined()) b = exec::cpu_alias(*bias);
  CubeInputs in;
  at::Tensor out;
  {
    NPU_KERNEL_SCOPE("aten::convolution_overrideable", "", d);
    in.t = {exec::cpu_alias(input), exec::cpu_alias(weight)};
    in.n = 2;
    in.round(family_rounding(kConv));
    out = at::convolution(in.t[0], in.t[1], b, stride, padding, dilation, transposed, output_padding, groups);
  }
  in.record(kConvForward);
  return exec::adopt_result(out, d);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> chip_convolution_backward(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight, c10::IntArrayRef stride,
    c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed, c10::IntArrayRef output_padding,
    int64_t groups, std::array<bool, 3> output_mask) {
  const int d = input.device().index();
  const std::vector<int64_t> bias_sizes{transposed ? weight.size(1) * groups : weight.size(0)};
  CubeInputs in;
  at::Tensor gi, gw, gb;
  {
    NPU_KERNEL_SCOPE("aten::convolution_backward_overrideable", "", d);
    in.t = {exec::cpu_alias(grad_output), exec::cpu_alias(input), exec::cpu_alias(weight)};
    in.n = 3;
    in.round(family_rounding(kConv));
    std::tie(gi, gw, gb) = at::convolution_backward(in.t[0], in.t[1], in.t[2], bias_sizes, stride, padding, dilation,
                                                    transposed, output_padding, groups, output_mask);
  }
  in.record(kConvBackward);
  return {exec::adopt_result(gi, d), exec::adopt_result(gw, d), exec::adopt_result(gb, d)};
}

// Replacing the default npu kernels is the point: the dispatcher's
// "Overriding a previously registered kernel" warning is dropped while the
// library registers; any other warning goes to the handler in place.
class QuietOverrideWarnings final : public c10::WarningHandler {
 public:
  QuietOverrideWarnings() : prev_(c10::WarningUtils::get_warning_handler()) {}
  void process(const c10::Warning& warning) override {
    if (warning.msg().find("Overriding a previously registered kernel") != std::string::npos) return;
    prev_->process(warning);
  }

 private:
  c10::WarningHandler* prev_;
};

std::mutex g_library_mu;
torch::Library* g_library = nullptr;

}  // namespace

void set_family_rounding(CubeFamily family, int rounding) {
  TORCH_CHECK(family == CubeFamily::Matmul || family == CubeFamily::Conv, "unknown cube family ",
              static_cast<int>(family));
  TORCH_CHECK(rounding >= -1 && rounding <= 1, "cube rounding must be -1 (keep fp32), 0 (HF32) or 1 (fp16), got ",
              rounding);
  g_rounding[static_cast<int>(family)].store(rounding, std::memory_order_relaxed);
}

void enable_chip_kernels(bool on) {
  std::lock_guard<std::mutex> guard(g_library_mu);
  if (on == (g_library != nullptr)) return;
  if (!on) {
    delete g_library;  // deregisters: the previous kernels are back
    g_library = nullptr;
    return;
  }
  QuietOverrideWarnings quiet;
  c10::WarningUtils::WarningHandlerGuard handler(&quiet);
  auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten",
                                              std::make_optional(c10::DispatchKey::PrivateUse1), __FILE__, __LINE__);
  for (size_t i = 0; i < kMatmulOps; ++i) {
    lib->impl(kOps[i].name, torch::CppFunction::makeFromBoxedFunctor(std::make_unique<ChipMatmulKernel>(i)));
  }
  lib->impl(kOps[kConvForward].name, &chip_convolution);
  lib->impl(kOps[kConvBackward].name, &chip_convolution_backward);
  g_library = lib.release();
}

std::vector<ChipOpCounts> chip_report() {
  std::vector<ChipOpCounts> report;
  for (size_t i = 0; i < kOps.size(); ++i) {
    const OpCounters& c = g_counts[i];
    const int64_t calls = c.calls.load(std::memory_order_relaxed);
    if (calls == 0) continue;
    report.push_back({kOps[i].name, calls, c.kinds.load(std::memory_order_relaxed),
                      c.elements.load(std::memory_order_relaxed), c.changed.load(std::memory_order_relaxed)});
  }
  return report;
}

void reset_chip_report() {
  for (OpCounters& c : g_counts) {
    c.calls.store(0, std::memory_order_relaxed);
    c.kinds.store(0, std::memory_order_relaxed);
    c.elements.store(0, std::memory_order_relaxed);
    c.changed.store(0, std::memory_order_relaxed);
  }
}

}  // namespace torch_npu::numerics
