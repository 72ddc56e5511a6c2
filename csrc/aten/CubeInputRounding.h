// Rounding of fp32 cube-op inputs for the chip-numerics mode (docs/numerics.md).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <tuple>

namespace torch_npu::numerics {

enum class CubeRounding : int { HF32 = 0, FP16 = 1 };

// A rounded copy of the float32 CPU tensor `input` (same sizes; same strides
// when `input` is non-overlapping and dense) and the number of elements whose
// bit pattern the rounding changed. One pass over the data.
std::tuple<at::Tensor, int64_t> round_cube_input(const at::Tensor& input, CubeRounding kind);

}  // namespace torch_npu::numerics
