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

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace torch_npu::numerics {
namespace {

constexpr uint32_t kExpMask = 0x7F800000u;
constexpr uint32_t kAbsMask = 0x7FFFFFFFu;
// HF32 keeps 11 of fp32's 23 explicit significand bits: 12 are dropped
// (docs/numerics.md: the Ascend docs give HF32 an 11-bit mantissa next to
// fp16's 10, and Ascend's msprobe simulates it by dropping 12 bits).
constexpr int kDropped = 12;
constexpr uint32_t kDroppedMask = (1u << kDropped) - 1;
// Elements per parallel chunk. The pass runs at memory speed: below this a
// second thread costs more to wake than it saves (clone-sized inputs).
constexpr int64_t kGrainSize = 262144;
// A block's lane counters are 32-bit: blocks keep them from wrapping.
constexpr int64_t kBlock = int64_t{1} << 30;

// A NaN (exponent all ones, significand not zero) is kept as it is.
inline bool is_nan_bits(uint32_t u) { return (u & kAbsMask) > kExpMask; }

// HF32: round to nearest, ties to even, on the dropped bits. Working on the
// bit pattern makes the carry do the IEEE work: a significand that rounds up
// to 2.0 bumps the exponent, the largest finite values round up to infinity,
// subnormals keep their fixed absolute step, infinities and zeros (of either
// sign) are unchanged. NaNs are returned unchanged (the carry could turn a
// NaN whose payload sits in the dropped bits into an infinity).
inline uint32_t hf32_bits(uint32_t u) {
  const uint32_t rounded = (u + (kDroppedMask >> 1) + ((u >> kDropped) & 1u)) & ~kDroppedMask;
  return is_nan_bits(u) ? u : rounded;
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

// The portable pass over n elements (the tail of the vector passes, and the
// whole pass where the CPU lacks AVX2/F16C); returns how many changed.
template <uint32_t (*Round)(uint32_t)>
int64_t scalar_pass(const uint32_t* in, uint32_t* dst, int64_t n) {
  int64_t changed = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = in[i];
    const uint32_t r = Round(u);
    dst[i] = r;
    changed += r != u;
  }
  return changed;
}

template <bool Fp16>
int64_t scalar_tail(const uint32_t* in, uint32_t* dst, int64_t n) {
  return Fp16 ? scalar_pass<fp16_bits>(in, dst, n) : scalar_pass<hf32_bits>(in, dst, n);
}

#if defined(__x86_64__) || defined(__i386__)
#define TORCH_NPU_ROUNDING_X86 1

// The vector passes: compiled for their target whatever the build flags,
// called only after a CPU feature check. Each step rounds a vector of
// elements, keeps the NaN lanes as they were and counts the changed lanes;
// the last few elements go through the portable code.

// AVX2 (and F16C for fp16), 8 elements a step.
template <bool Fp16>
__attribute__((target("avx2,f16c"))) int64_t avx2_block(const uint32_t* in, uint32_t* dst, int64_t n) {
  const __m256i abs_mask = _mm256_set1_epi32(static_cast<int>(kAbsMask));
  const __m256i exp_mask = _mm256_set1_epi32(static_cast<int>(kExpMask));
  const __m256i half = _mm256_set1_epi32(kDroppedMask >> 1);
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i keep = _mm256_set1_epi32(static_cast<int>(~kDroppedMask));
  __m256i unchanged = _mm256_setzero_si256();  // per lane, minus the unchanged count (cmpeq is -1)
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i));
    __m256i rounded;
    if constexpr (Fp16) {
      const __m128i h = _mm256_cvtps_ph(_mm256_castsi256_ps(u), _MM_FROUND_TO_NEAREST_INT);
      rounded = _mm256_castps_si256(_mm256_cvtph_ps(h));
    } else {
      const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, kDropped), one);
      rounded = _mm256_and_si256(_mm256_add_epi32(_mm256_add_epi32(u, half), lsb), keep);
    }
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), exp_mask);
    const __m256i r = _mm256_blendv_epi8(rounded, u, nan);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), r);
    unchanged = _mm256_sub_epi32(unchanged, _mm256_cmpeq_epi32(r, u));
  }
  alignas(32) uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), unchanged);
  int64_t changed = i;
  for (uint32_t lane : lanes) changed -= lane;
  return changed + scalar_tail<Fp16>(in + i, dst + i, n - i);
}

// AVX-512F, 16 elements a step, with mask registers for the NaN lanes and the count.
// (GCC 12's AVX-512 headers self-initialize their "undefined" vectors, which
// -Wmaybe-uninitialized reports: GCC bug 105593.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
template <bool Fp16>
__attribute__((target("avx512f,popcnt"))) int64_t avx512_block(const uint32_t* in, uint32_t* dst, int64_t n) {
  const __m512i abs_mask = _mm512_set1_epi32(static_cast<int>(kAbsMask));
  const __m512i exp_mask = _mm512_set1_epi32(static_cast<int>(kExpMask));
  const __m512i half = _mm512_set1_epi32(kDroppedMask >> 1);
  const __m512i one = _mm512_set1_epi32(1);
  const __m512i keep = _mm512_set1_epi32(static_cast<int>(~kDroppedMask));
  int64_t changed = 0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i u = _mm512_loadu_si512(in + i);
    __m512i rounded;
    if constexpr (Fp16) {
      const __m256i h = _mm512_cvtps_ph(_mm512_castsi512_ps(u), _MM_FROUND_TO_NEAREST_INT);
      rounded = _mm512_castps_si512(_mm512_cvtph_ps(h));
    } else {
      const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, kDropped), one);
      rounded = _mm512_and_si512(_mm512_add_epi32(_mm512_add_epi32(u, half), lsb), keep);
    }
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs_mask), exp_mask);
    const __m512i r = _mm512_mask_mov_epi32(rounded, nan, u);
    _mm512_storeu_si512(dst + i, r);
    changed += __builtin_popcount(_mm512_cmpneq_epi32_mask(r, u));
  }
  return changed + scalar_tail<Fp16>(in + i, dst + i, n - i);
}
#pragma GCC diagnostic pop
#endif

RoundingIsa cpu_rounding_isa() {
#ifdef TORCH_NPU_ROUNDING_X86
  static const RoundingIsa isa = __builtin_cpu_supports("avx512f")                                    ? RoundingIsa::Avx512
                                 : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") ? RoundingIsa::Avx2
                                                                                                    : RoundingIsa::Portable;
  return isa;
#else
  return RoundingIsa::Portable;
#endif
}

// One chunk of the pass, with the best instruction set up to `isa`.
template <bool Fp16>
int64_t round_range(const uint32_t* in, uint32_t* dst, int64_t n, RoundingIsa isa) {
#ifdef TORCH_NPU_ROUNDING_X86
  if (isa != RoundingIsa::Portable) {
    int64_t changed = 0;
    for (int64_t i = 0; i < n; i += kBlock) {
      const int64_t m = std::min(kBlock, n - i);
      changed += isa == RoundingIsa::Avx512 ? avx512_block<Fp16>(in + i, dst + i, m)
                                            : avx2_block<Fp16>(in + i, dst + i, m);
    }
    return changed;
  }
#endif
  return scalar_tail<Fp16>(in, dst, n);
}

}  // namespace

RoundingIsa best_rounding_isa() { return cpu_rounding_isa(); }

std::tuple<at::Tensor, int64_t> round_cube_input(const at::Tensor& input, CubeRounding kind, RoundingIsa max_isa) {
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
  const RoundingIsa isa = std::min(max_isa, cpu_rounding_isa());
  const bool fp16 = kind == CubeRounding::FP16;
  auto range = [&](int64_t begin, int64_t end) {
    return fp16 ? round_range<true>(in + begin, dst + begin, end - begin, isa)
                : round_range<false>(in + begin, dst + begin, end - begin, isa);
  };
  if (n <= kGrainSize) return {out, range(0, n)};
  const int64_t changed = at::parallel_reduce(
      0, n, kGrainSize, int64_t{0}, [&](int64_t begin, int64_t end, int64_t acc) { return acc + range(begin, end); },
      [](int64_t a, int64_t b) { return a + b; });
  return {out, changed};
}

}  // namespace torch_npu::numerics
