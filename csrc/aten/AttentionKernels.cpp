// scaled_dot_product_attention asks a per-device stub which fused kernel to
// use. Answer for npu exactly as the CPU does, so npu runs the same
// (flash-attention-for-CPU) kernel on zero-copy aliases.
#include <ATen/ops/_fused_sdp_choice.h>
#include <ATen/native/transformers/attention.h>

#include "aten/OpExecution.h"

namespace torch_npu::kernels {
namespace {

int64_t npu_fused_sdp_choice(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const std::optional<at::Tensor>& mask, double dropout_p, bool is_causal,
                             std::optional<double> scale, bool enable_gqa) {
  // The choice depends on requires_grad (no fused kernel for a mask that
  // needs a gradient), so the aliases carry it.
  auto alias = [](const at::Tensor& t) {
    if (t.device().type() != c10::DeviceType::PrivateUse1) return t;
    at::Tensor a = exec::cpu_alias(t);
    if (t.requires_grad()) a.requires_grad_(true);
    return a;
  };
  std::optional<at::Tensor> m;
  if (mask.has_value() && mask->defined()) m = alias(*mask);
  return at::_fused_sdp_choice(alias(q), alias(k), alias(v), m, dropout_p, is_causal, scale, enable_gqa);
}

}  // namespace
}  // namespace torch_npu::kernels

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &torch_npu::kernels::npu_fused_sdp_choice)
}
