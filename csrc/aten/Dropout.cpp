// Dropout on npu. native_dropout's CPU kernel draws from the CPU default
// generator (it takes no Generator argument); on npu it must draw from the
// npu generator, so it has a kernel of its own.
//
// PyTorch sends an npu tensor's dropout to the fused native_dropout and
// native_dropout_backward, as on CUDA and in torch_npu, where a CPU tensor
// takes a composite (bernoulli_, div_, mul; backward one mul). Written as
// ATen ops, the fused pair costs more passes than that composite: mul, mul_
// and a cast to the bool mask forward; the mask cast back, mul and mul
// backward. Here each direction is one loop after the draw (float, double,
// bfloat16 and, with F16C, half on contiguous memory), computing the same
// operations in the same order and precision as those ATen ops, so the bits
// do not change (tests/test_dropout.py holds them to the CPU ops); anything
// else runs the ATen ops themselves.
#include "aten/Dropout.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/TensorIterator.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/native_dropout_backward_ops.h>
#include <ATen/ops/ones_like.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <c10/util/bit_cast.h>
#include <torch/library.h>

#include <atomic>
#include <cstdint>
#include <type_traits>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "aten/OpExecution.h"
#include "core/NPUGenerator.h"

namespace torch_npu::kernels {
namespace {

// The loops compute in T's op-math type (float for bfloat16) and see memory
// as plain scalars (bfloat16 as its bits, bool as a byte), which the
// vectorizer takes. bfloat16 is widened and rounded to nearest even with
// integer operations; for every value but NaN these give the bits of c10's
// scalar and ATen's vectorized conversions. Half has loops of its own below:
// c10's portable float-to-half conversion, written per element, made these
// loops twice as slow as the ATen ops' F16C ones on large tensors (measured).
template <class T>
struct Elem {
  using Raw = T;
  static T load(T v) { return v; }
  static void store(T& o, T v) { o = v; }
};
template <>
struct Elem<c10::BFloat16> {
  using Raw = uint16_t;
  static float load(uint16_t v) { return c10::bit_cast<float>(static_cast<uint32_t>(v) << 16); }
  static void store(uint16_t& o, float v) {
    const uint32_t b = c10::bit_cast<uint32_t>(v);
    o = static_cast<uint16_t>((b + UINT32_C(0x7FFF) + ((b >> 16) & 1)) >> 16);
  }
};

// A NaN result is one the loops may round to bfloat16 with other bits than
// the ATen ops: ATen's vectorized float-to-bfloat16 rounding keeps other NaN
// bits than its scalar one, so which a NaN gets depends on where it falls in
// the op's vector loop. The loops report one, and the caller recomputes with
// the ATen ops. Float and double products are IEEE operations, the same bits
// in any loop.
template <class T>
constexpr bool kReportsNan = !std::is_same_v<T, at::opmath_type<T>>;

// Blocks of a fixed size let -O2's vectorizer take the loop body.
constexpr int64_t kBlock = 16;

// out = x.mul(keep).mul_(scale) and mask = keep.to(bool), for a keep of 0s and
// 1s, with `scale` as mul_ takes it. x * keep is x or a zero, already a T value
// (NaN aside), so the ATen ops' rounding to T between the products changes
// nothing. Returns whether a result is NaN (bfloat16 only).
template <class T, class O = at::opmath_type<T>, class R = typename Elem<T>::Raw>
inline int forward_block(const R* __restrict__ x, const R* __restrict__ keep, R* __restrict__ out,
                         uint8_t* __restrict__ mask, int64_t n, O scale) {
  int nan = 0;
  for (int64_t i = 0; i < n; ++i) {
    const O k = Elem<T>::load(keep[i]);
    const O r = Elem<T>::load(x[i]) * k * scale;
    Elem<T>::store(out[i], r);
    mask[i] = static_cast<uint8_t>(k != O(0));
    if constexpr (kReportsNan<T>) nan |= r != r;
  }
  return nan;
}

template <class T, class O = at::opmath_type<T>, class R = typename Elem<T>::Raw>
bool dropout_forward_loop(const R* x, const R* keep, R* out, uint8_t* mask, int64_t n, O scale) {
  int nan = 0;
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) nan |= forward_block<T>(x + i, keep + i, out + i, mask + i, kBlock, scale);
  nan |= forward_block<T>(x + i, keep + i, out + i, mask + i, n - i, scale);
  return nan != 0;
}

// grad * mask * scale: the bool mask promoted to T (0 or 1), then the two
// products, with `scale` as mul(Scalar) takes it. Returns what forward_block does.
template <class T, class O = at::opmath_type<T>, class R = typename Elem<T>::Raw>
inline int backward_block(const R* __restrict__ grad, const uint8_t* __restrict__ mask, R* __restrict__ out,
                          int64_t n, O scale) {
  int nan = 0;
  for (int64_t i = 0; i < n; ++i) {
    const O r = Elem<T>::load(grad[i]) * static_cast<O>(mask[i]) * scale;
    Elem<T>::store(out[i], r);
    if constexpr (kReportsNan<T>) nan |= r != r;
  }
  return nan;
}

template <class T, class O = at::opmath_type<T>, class R = typename Elem<T>::Raw>
bool dropout_backward_loop(const R* grad, const uint8_t* mask, R* out, int64_t n, O scale) {
  int nan = 0;
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) nan |= backward_block<T>(grad + i, mask + i, out + i, kBlock, scale);
  nan |= backward_block<T>(grad + i, mask + i, out + i, n - i, scale);
  return nan != 0;
}

#if defined(__x86_64__)
// Half: F16C converts 8 values per instruction with round to nearest even,
// the conversion ATen's own half kernels use on this CPU (their scalar tails'
// software conversion rounds the same way). The loops run where the CPU has
// F16C and AVX2; elsewhere half keeps the ATen ops. NaNs are reported as for
// bfloat16 (F16C keeps NaN bits the software conversion does not).
bool has_f16c() {
  static const bool yes = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx2");
  return yes;
}

__attribute__((target("avx2,f16c"))) bool half_forward_loop(const uint16_t* x, const uint16_t* keep, uint16_t* out,
                                                             uint8_t* mask, int64_t n, float scale) {
  const __m256 s = _mm256_set1_ps(scale);
  const __m256 zero = _mm256_setzero_ps();
  int nan = 0;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 k = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(keep + i)));
    const __m256 xv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i)));
    const __m256 r = _mm256_mul_ps(_mm256_mul_ps(xv, k), s);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm256_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT));
    const int kept = _mm256_movemask_ps(_mm256_cmp_ps(k, zero, _CMP_NEQ_OQ));
    for (int j = 0; j < 8; ++j) mask[i + j] = static_cast<uint8_t>((kept >> j) & 1);
    nan |= _mm256_movemask_ps(_mm256_cmp_ps(r, r, _CMP_UNORD_Q));
  }
  for (; i < n; ++i) {
    const float k = _cvtsh_ss(keep[i]);
    const float r = _cvtsh_ss(x[i]) * k * scale;
    out[i] = _cvtss_sh(r, _MM_FROUND_TO_NEAREST_INT);
    mask[i] = static_cast<uint8_t>(k != 0.0f);
    nan |= r != r;
  }
  return nan != 0;
}

__attribute__((target("avx2,f16c"))) bool half_backward_loop(const uint16_t* grad, const uint8_t* mask, uint16_t* out,
                                                              int64_t n, float scale) {
  const __m256 s = _mm256_set1_ps(scale);
  int nan = 0;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 m = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(mask + i))));
    const __m256 g = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(grad + i)));
    const __m256 r = _mm256_mul_ps(_mm256_mul_ps(g, m), s);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm256_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT));
    nan |= _mm256_movemask_ps(_mm256_cmp_ps(r, r, _CMP_UNORD_Q));
  }
  for (; i < n; ++i) {
    const float r = _cvtsh_ss(grad[i]) * static_cast<float>(mask[i]) * scale;
    out[i] = _cvtss_sh(r, _MM_FROUND_TO_NEAREST_INT);
    nan |= r != r;
  }
  return nan != 0;
}
#else
bool has_f16c() { return false; }
bool half_forward_loop(const uint16_t*, const uint16_t*, uint16_t*, uint8_t*, int64_t, float) { return true; }
bool half_backward_loop(const uint16_t*, const uint8_t*, uint16_t*, int64_t, float) { return true; }
#endif

// One chunk of each direction for dtype T, `scale` as the ATen op takes it:
// mul_(Scalar) rounds the forward's scalar to T first (mul(Scalar) does not).
template <class T>
bool forward_chunk(const T* x, const T* keep, T* out, uint8_t* mask, int64_t n, double scale) {
  using R = typename Elem<T>::Raw;
  return dropout_forward_loop<T>(reinterpret_cast<const R*>(x), reinterpret_cast<const R*>(keep),
                                 reinterpret_cast<R*>(out), mask, n,
                                 static_cast<at::opmath_type<T>>(static_cast<T>(scale)));
}
inline bool forward_chunk(const c10::Half* x, const c10::Half* keep, c10::Half* out, uint8_t* mask, int64_t n,
                          double scale) {
  return half_forward_loop(reinterpret_cast<const uint16_t*>(x), reinterpret_cast<const uint16_t*>(keep),
                           reinterpret_cast<uint16_t*>(out), mask, n,
                           static_cast<float>(static_cast<c10::Half>(scale)));
}
template <class T>
bool backward_chunk(const T* grad, const uint8_t* mask, T* out, int64_t n, double scale) {
  using R = typename Elem<T>::Raw;
  return dropout_backward_loop<T>(reinterpret_cast<const R*>(grad), mask, reinterpret_cast<R*>(out), n,
                                  static_cast<at::opmath_type<T>>(scale));
}
inline bool backward_chunk(const c10::Half* grad, const uint8_t* mask, c10::Half* out, int64_t n, double scale) {
  return half_backward_loop(reinterpret_cast<const uint16_t*>(grad), mask, reinterpret_cast<uint16_t*>(out), n,
                            static_cast<float>(scale));
}

bool fusable(const at::Tensor& t) {
  const at::ScalarType st = t.scalar_type();
  return (st == at::kFloat || st == at::kDouble || st == at::kBFloat16 || (st == at::kHalf && has_f16c())) &&
         t.is_contiguous() && !t.is_neg() && t.layout() == at::kStrided;
}

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
      if (fusable(x)) {
        out = at::empty_like(x, at::MemoryFormat::Contiguous);
        mask = at::empty_like(x, x.options().dtype(at::kBool), at::MemoryFormat::Contiguous);
        std::atomic<bool> nan{false};
        AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "native_dropout", [&] {
          const scalar_t* xp = x.const_data_ptr<scalar_t>();
          const scalar_t* kp = m.const_data_ptr<scalar_t>();
          scalar_t* op = out.mutable_data_ptr<scalar_t>();
          uint8_t* mp = reinterpret_cast<uint8_t*>(mask.mutable_data_ptr<bool>());
          at::parallel_for(0, x.numel(), at::internal::GRAIN_SIZE, [&](int64_t b, int64_t e) {
            if (forward_chunk(xp + b, kp + b, op + b, mp + b, e - b, scale)) nan = true;
          });
        });
        if (nan) out = x.mul(m).mul_(scale);
      } else {
        out = x.mul(m).mul_(scale);
        mask = m.to(at::kBool);
      }
    } else {
      out = x.clone();
      mask = at::ones_like(x, x.options().dtype(at::kBool));
    }
  }
  return {exec::adopt_result(out, d), exec::adopt_result(mask, d)};
}

}  // namespace

at::Tensor dropout_backward_cpu(const at::Tensor& grad, const at::Tensor& mask, double scale) {
  if (!(fusable(grad) && mask.is_contiguous() && mask.scalar_type() == at::kBool && mask.layout() == at::kStrided &&
        grad.sizes() == mask.sizes() && grad.numel() > 0)) {
    return at::_ops::native_dropout_backward::redispatch(c10::DispatchKeySet(c10::DispatchKey::CPU), grad, mask, scale);
  }
  at::Tensor out = at::empty_like(grad, at::MemoryFormat::Contiguous);
  std::atomic<bool> nan{false};
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, grad.scalar_type(), "native_dropout_backward", [&] {
    const scalar_t* gp = grad.const_data_ptr<scalar_t>();
    const uint8_t* mp = reinterpret_cast<const uint8_t*>(mask.const_data_ptr<bool>());
    scalar_t* op = out.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, grad.numel(), at::internal::GRAIN_SIZE, [&](int64_t b, int64_t e) {
      if (backward_chunk(gp + b, mp + b, op + b, e - b, scale)) nan = true;
    });
  });
  if (nan) return at::_ops::native_dropout_backward::redispatch(c10::DispatchKeySet(c10::DispatchKey::CPU), grad, mask, scale);
  return out;
}

}  // namespace torch_npu::kernels

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("native_dropout", &torch_npu::kernels::native_dropout);
}
