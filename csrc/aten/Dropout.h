// Dropout's npu kernels (Dropout.cpp): native_dropout draws its mask from
// the npu generator, and both directions run in one pass over memory where
// the CPU runs two to four, with the CPU's bits.
#pragma once

#include <ATen/core/Tensor.h>

namespace torch_npu::kernels {

// What CPU native_dropout_backward returns for these CPU tensors,
// grad * mask * scale, in one pass when grad and mask are contiguous, of one
// shape, mask bool and grad floating; otherwise the CPU kernel itself.
at::Tensor dropout_backward_cpu(const at::Tensor& grad, const at::Tensor& mask, double scale);

}  // namespace torch_npu::kernels
