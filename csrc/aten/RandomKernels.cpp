// Random ops whose CPU kernel draws from the CPU default generator without
// taking a Generator argument; on npu they must draw from the npu generator.
#include <ATen/ops/empty_like.h>
#include <ATen/ops/ones_like.h>
#include <torch/library.h>

#include "aten/OpExecution.h"
#include "core/NPUGenerator.h"

namespace torch_npu::kernels {
namespace {

std::tuple<at::Tensor, at::Tensor> native_dropout(const at::Tensor& input, double p, std::optional<bool> train) {
  int d = input.device().index();
  at::Tensor out, mask;
  {
    NPU_KERNEL_SCOPE("aten::native_dropout", "", d);
    at::Tensor x = exec::cpu_alias(input);
    if (input.numel() == 0) {
      out = x.clone();
      mask = at::empty_like(x, x.options().dtype(at::kBool));
    } else if (!train.has_value() || *train) {
      double keep = 1.0 - p;
      double scale = keep == 0.0 ? 0.0 : 1.0 / keep;
      at::Generator gen =
          default_generator(static_cast<c10::DeviceIndex>(d)).get<NPUGeneratorImpl>()->engine_for_op(input.numel());
      at::Tensor m = at::empty_like(x, at::MemoryFormat::Contiguous);
      m.bernoulli_(keep, gen);
      out = x.mul(m).mul_(scale);
      mask = m.to(at::kBool);
    } else {
      out = x.clone();
      mask = at::ones_like(x, x.options().dtype(at::kBool));
    }
  }
  return {exec::adopt_result(out, d), exec::adopt_result(mask, d)};
}

}  // namespace
}  // namespace torch_npu::kernels

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("native_dropout", &torch_npu::kernels::native_dropout);
}
