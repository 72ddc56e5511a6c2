// Rounding of fp32 cube-op inputs for the chip-numerics mode (docs/numerics.md).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <tuple>

namespace torch_npu::numerics {

enum class CubeRounding : int { HF32 = 0, FP16 = 1 };

// The instruction sets of the rounding pass, from the portable one up.
enum class RoundingIsa : int { Portable = 0, Avx2 = 1, Avx512 = 2 };

// A rounded copy of the float32 CPU tensor `input` (same sizes; same strides
// when `input` is non-overlapping and dense) and the number of elements whose
// bit pattern the rounding changed. One pass over the data, with the best
// vector instructions the CPU has (AVX-512F, or AVX2 with F16C) up to
// `max_isa`; tests compare the instruction sets with each other.
std::tuple<at::Tensor, int64_t> round_cube_input(const at::Tensor& input, CubeRounding kind,
                                                 RoundingIsa max_isa = RoundingIsa::Avx512);

// The best instruction set round_cube_input uses on this CPU.
RoundingIsa best_rounding_isa();

}  // namespace torch_npu::numerics
