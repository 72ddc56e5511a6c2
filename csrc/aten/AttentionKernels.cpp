// scaled_dot_product_attention asks a per-device stub which fused kernel to
// use. Answer for npu exactly as the CPU does, so npu runs the same
// (flash-attention-for-CPU) kernel on zero-copy aliases.
#include <ATen/native/transformers/attention.h>
#include <c10/core/TensorImpl.h>

#include <vector>


namespace at::native {
// The CPU answer (exported by libtorch_cpu; no public header declares it).
int64_t _fused_sdp_choice_cpp(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                              const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
                              std::optional<double> scale, bool enable_gqa);
}  // namespace at::native

namespace torch_npu::kernels {
namespace {

// A storage-less stand-in for a mask: its dtype, dim and sizes, and its
// strides with the last one 1. Built directly (no dispatch: torch.compile's
// tracing modes must not see it); symbolic sizes and strides carry over.
at::Tensor mask_with_unit_last_stride(const at::Tensor& mask) {
  auto t = at::detail::make_tensor<c10::TensorImpl>(c10::DispatchKeySet(c10::DispatchKey::Meta), mask.dtype(),
                                                    c10::Device(c10::DeviceType::Meta));
  std::vector<c10::SymInt> strides(mask.sym_strides().begin(), mask.sym_strides().end());
  strides.back() = 1;
  t.unsafeGetTensorImpl()->set_sizes_and_strides(mask.sym_sizes(), strides);
  return t;
}

int64_t npu_fused_sdp_choice(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const std::optional<at::Tensor>& mask, double dropout_p, bool is_causal,
                             std::optional<double> scale, bool enable_gqa) {
  // The CPU rules read only metadata (shapes, strides, dtypes, requires_grad),
  // so they apply to the npu tensors as they are - fake tensors included,
  // which is what torch.compile passes while tracing. One rule reads the
  // query's device: off the CPU, a mask's last dimension must have stride 1
  // (a GPU kernel requirement the CPU flash kernel does not have). The CPU
  // answer for such a mask is the answer for the same mask with stride 1
  // there, which nothing else in the rules reads (a mask that requires grad
  // rules flash out either way).
  if (mask.has_value() && mask->defined() && mask->dim() > 0 && !mask->requires_grad() &&
      mask->sym_stride(-1) != 1) {
    const std::optional<at::Tensor> stand_in = mask_with_unit_last_stride(*mask);
    return at::native::_fused_sdp_choice_cpp(q, k, v, stand_in, dropout_p, is_causal, scale, enable_gqa);
  }
  return at::native::_fused_sdp_choice_cpp(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa);
}

}  // namespace
}  // namespace torch_npu::kernels

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &torch_npu::kernels::npu_fused_sdp_choice)
}
