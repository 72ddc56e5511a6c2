// scaled_dot_product_attention asks a per-device stub which fused kernel to
// use. Answer for npu exactly as the CPU does, so npu runs the same
// (flash-attention-for-CPU) kernel on zero-copy aliases.
#include <ATen/native/transformers/attention.h>


namespace at::native {
// The CPU answer (exported by libtorch_cpu; no public header declares it).
int64_t _fused_sdp_choice_cpp(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                              const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
                              std::optional<double> scale, bool enable_gqa);
}  // namespace at::native

namespace torch_npu::kernels {
namespace {

int64_t npu_fused_sdp_choice(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const std::optional<at::Tensor>& mask, double dropout_p, bool is_causal,
                             std::optional<double> scale, bool enable_gqa) {
  // The CPU rules read only metadata (shapes, strides, dtypes, requires_grad),
  // so they apply to the npu tensors as they are - fake tensors included,
  // which is what torch.compile passes while tracing.
  return at::native::_fused_sdp_choice_cpp(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa);
}

}  // namespace
}  // namespace torch_npu::kernels

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &torch_npu::kernels::npu_fused_sdp_choice)
}
