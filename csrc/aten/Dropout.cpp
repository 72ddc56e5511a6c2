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
// bfloat16 on contiguous memory), computing the same operations in the same
// order and precision as those ATen ops, so the bits do not change
// (tests/test_dropout.py holds them to the CPU ops); anything else runs the
// ATen ops themselves.
#include "aten/Dropout.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/TensorIterator.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/native_dropout_backward_ops.h>
#include <ATen/ops/ones_like.h>
#include <c10/util/BFloat16.h>
#include <c10/util/bit_cast.h>
#include <torch/library.h>

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "aten/OpExecution.h"
#include "core/NPUGenerator.h"

namespace torch_npu::kernels {
namespace {

// The loops compute in T's op-math type (float for bfloat16) and see memory
// as plain scalars (bfloat16 as its bits, bool as a byte), which the
// vectorizer takes. bfloat16 is widened and rounded to nearest even with
// integer operations; for every value but NaN these give the bits of c10's
// scalar and ATen's vectorized conversions. Half keeps the ATen ops: c10's
// portable float-to-half conversion, written per element, made the loops
// twice as slow as the ATen ops' F16C ones on large tensors (measured).
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
// the op's vector loop. The loops report one,
// and the caller recomputes with the ATen ops. Float and double products are
// IEEE operations, the same bits in any loop.
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

bool fusable(const at::Tensor& t) {
  const at::ScalarType st = t.scalar_type();
  return (st == at::kFloat || st == at::kDouble || st == at::kBFloat16) && t.is_contiguous() && !t.is_neg() &&
         t.layout() == at::kStrided;
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
        AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "native_dropout", [&] {
          using R = typename Elem<scalar_t>::Raw;
          const R* xp = reinterpret_cast<const R*>(x.const_data_ptr<scalar_t>());
          const R* kp = reinterpret_cast<const R*>(m.const_data_ptr<scalar_t>());
          R* op = reinterpret_cast<R*>(out.mutable_data_ptr<scalar_t>());
          uint8_t* mp = reinterpret_cast<uint8_t*>(mask.mutable_data_ptr<bool>());
          // mul_(Scalar) rounds its scalar to the tensor's dtype first (mul(Scalar) does not).
          const auto s = static_cast<at::opmath_type<scalar_t>>(static_cast<scalar_t>(scale));
          at::parallel_for(0, x.numel(), at::internal::GRAIN_SIZE, [&](int64_t b, int64_t e) {
            if (dropout_forward_loop<scalar_t>(xp + b, kp + b, op + b, mp + b, e - b, s)) nan = true;
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
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, grad.scalar_type(), "native_dropout_backward", [&] {
    using R = typename Elem<scalar_t>::Raw;
    const R* gp = reinterpret_cast<const R*>(grad.const_data_ptr<scalar_t>());
    const uint8_t* mp = reinterpret_cast<const uint8_t*>(mask.const_data_ptr<bool>());
    R* op = reinterpret_cast<R*>(out.mutable_data_ptr<scalar_t>());
    const auto s = static_cast<at::opmath_type<scalar_t>>(scale);
    at::parallel_for(0, grad.numel(), at::internal::GRAIN_SIZE, [&](int64_t b, int64_t e) {
      if (dropout_backward_loop<scalar_t>(gp + b, mp + b, op + b, e - b, s)) nan = true;
    });
  });
  if (nan) return at::_ops::native_dropout_backward::redispatch(c10::DispatchKeySet(c10::DispatchKey::CPU), grad, mask, scale);
  return out;
}

}  // namespace torch_npu::kernels

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("native_dropout", &torch_npu::kernels::native_dropout);
}
