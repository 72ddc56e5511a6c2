// scaled_dot_product_attention asks a per-device stub which fused kernel to
// use. Answer for npu exactly as the CPU does, so npu runs the same
// (flash-attention-for-CPU) kernel on zero-copy aliases.
#include <ATen/Functions.h>
#include <ATen/native/transformers/attention.h>

#include "aten/OpExecution.h"

namespace torch_npu::kernels {
namespace {

int64_t npu_fused_sdp_choice(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const std::optional<at::Tensor>& mask, double dropout_p, bool is_causal,
                             std::optional<double> scale, bool enable_gqa) {
  std::optional<at::Tensor> m;
  if (mask.has_value() && mask->defined()) {
    m = mask->device().type() == c10::DeviceType::PrivateUse1 ? exec::cpu_alias(*mask) : *mask;
  }
  return at::_fused_sdp_choice(exec::cpu_alias(q), exec::cpu_alias(k), exec::cpu_alias(v), m, dropout_p, is_causal,
                               scale, enable_gqa);
}

}  // namespace
}  // namespace torch_npu::kernels

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &torch_npu::kernels::npu_fused_sdp_choice)
}
