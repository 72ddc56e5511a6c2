// Chip-numerics mode (torch_npu.emulator.set_numerics("chip")): the one
// elementwise pass that rounds an fp32 cube-op input to the precision the
// 910B cube unit computes with (HF32 or fp16), counting what it changed.
// docs/numerics.md states the rules and their sources.
#include "aten/CubeInputRounding.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty_strided.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace torch_npu::numerics {
namespace {

constexpr uint32_t kExpMask = 0x7F800000u;
constexpr uint32_t kManMask = 0x007FFFFFu;
// HF32 keeps 11 of fp32's 23 explicit significand bits: 12 are dropped
// (docs/numerics.md: the Ascend docs give HF32 an 11-bit mantissa next to
// fp16's 10, and Ascend's msprobe simulates it by dropping 12 bits).
constexpr int kDropped = 12;
constexpr uint32_t kDroppedMask = (1u << kDropped) - 1;
// elements per parallel chunk (ATen's usual grain)
constexpr int64_t kGrainSize = 32768;

inline bool is_nan_bits(uint32_t u) { return (u & kExpMask) == kExpMask && (u & kManMask) != 0; }

// The HF32 pass over [begin, end), returning how many elements changed.
// Round to nearest, ties to even, on the dropped bits. Working on the bit
// pattern makes the carry do the IEEE work: a significand that rounds up to
// 2.0 bumps the exponent, the largest finite values round up to infinity,
// subnormals keep their fixed absolute step, infinities and zeros (of either
// sign) are unchanged. NaNs are returned unchanged (the carry could turn a
// NaN whose payload sits in the dropped bits into an infinity).
// Branch-free, with a 32-bit count: GCC vectorizes the loop (checked with -fopt-info-vec).
__attribute__((optimize("O3"))) uint32_t hf32_block(const uint32_t* __restrict__ in, uint32_t* __restrict__ dst,
                                                   int64_t n) {
  uint32_t changed = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = in[i];
    const uint32_t rounded = (u + (kDroppedMask >> 1) + ((u >> kDropped) & 1u)) & ~kDroppedMask;
    // a NaN (exponent all ones, significand not zero) is kept
    const uint32_t r = (u & 0x7FFFFFFFu) > kExpMask ? u : rounded;
    dst[i] = r;
    changed += r != u ? 1u : 0u;
  }
  return changed;
}

int64_t hf32_range(const uint32_t* in, uint32_t* dst, int64_t begin, int64_t end) {
  constexpr int64_t kBlock = int64_t{1} << 30;  // the 32-bit count of hf32_block cannot wrap
  int64_t changed = 0;
  for (int64_t i = begin; i < end; i += kBlock) {
    changed += hf32_block(in + i, dst + i, std::min(kBlock, end - i));
  }
  return changed;
}

inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// fp32 -> fp16 -> fp32 with c10::Half's IEEE conversion (round to nearest
// even, overflow to infinity, fp16 subnormals kept). A NaN stays a NaN.
inline uint32_t fp16_bits(uint32_t u) {
  if (is_nan_bits(u)) return u;
  return float_bits(static_cast<float>(c10::Half(bits_float(u))));
}

}  // namespace

std::tuple<at::Tensor, int64_t> round_cube_input(const at::Tensor& input, CubeRounding kind) {
  TORCH_CHECK(input.device().is_cpu(), "round_cube_input expects a CPU tensor (an alias of npu memory), got ",
              input.device());
  TORCH_CHECK(input.scalar_type() == at::kFloat, "round_cube_input expects a float32 tensor, got ",
              input.scalar_type());
  // Dense inputs keep their strides, so the CPU kernel that follows takes the
  // same path (BLAS transposition, conv layout) it takes on the unrounded input.
  const at::Tensor src = input.is_non_overlapping_and_dense() ? input : input.contiguous();
  at::Tensor out = at::empty_strided(src.sizes(), src.strides(), src.options());
  const int64_t n = src.numel();
  if (n == 0) return {out, 0};
  const auto* in = reinterpret_cast<const uint32_t*>(src.const_data_ptr<float>());
  auto* dst = reinterpret_cast<uint32_t*>(out.mutable_data_ptr<float>());
  const bool hf32 = kind == CubeRounding::HF32;
  const int64_t changed = at::parallel_reduce(
      0, n, kGrainSize, int64_t{0},
      [&](int64_t begin, int64_t end, int64_t acc) {
        if (hf32) return acc + hf32_range(in, dst, begin, end);
        for (int64_t i = begin; i < end; ++i) {
          const uint32_t u = in[i];
          const uint32_t r = fp16_bits(u);
          dst[i] = r;
          acc += r != u;
        }
        return acc;
      },
      [](int64_t a, int64_t b) { return a + b; });
  return {out, changed};
}

}  // namespace torch_npu::numerics
