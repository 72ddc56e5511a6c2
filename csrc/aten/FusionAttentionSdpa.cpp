// npu_fusion_attention's common cases (no pse, no mask or a top-left causal
// one; no dropout, or dropout on a small call) in C++: the same ATen ops, in
// the same order and blocks, as op_plugin/attention/flash.py's
// sdpa_attention / small_dropout_attention and layout.py's Plan, so the
// results are bitwise those of the Python paths, without their per-op Python
// cost. Autograd differentiates the forward through those ATen ops (the CPU
// flash kernel's own derivative without dropout), as in the Python paths.
#include "aten/FusionAttentionSdpa.h"

#include "aten/CpuGraph.h"
#include "aten/OpExecution.h"
#include "core/NPUGenerator.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/library.h>

#include <array>
#include <atomic>
#include <mutex>
#include <utility>

#include <algorithm>
#include <cmath>
#include <vector>

namespace torch_npu::kernels {
namespace {

// dropout_mask.BLOCK_ROWS, flash._CAUSAL_ROWS (flash.CHUNK_ELEMENTS and
// SMALL_ELEMENTS come from the caller: Python owns them, tests patch them).
constexpr int64_t kBlockRows = 16;
constexpr int64_t kCausalRows = 128;

enum class Layout { BSH, SBH, BSND, BNSD };

std::optional<Layout> parse_layout(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (s == "BSH") return Layout::BSH;
  if (s == "SBH") return Layout::SBH;
  if (s == "BSND") return Layout::BSND;
  if (s == "BNSD") return Layout::BNSD;
  return std::nullopt;
}

// flash.to_bnsd, for shapes already checked (reshape: a view of the inputs; a gradient in the
// input layout need not be viewable).
at::Tensor to_bnsd(const at::Tensor& x, Layout layout, int64_t head_dim) {
  switch (layout) {
    case Layout::BSH:
      return x.reshape({x.size(0), x.size(1), x.size(2) / head_dim, head_dim}).transpose(1, 2);
    case Layout::SBH:
      return x.reshape({x.size(0), x.size(1), x.size(2) / head_dim, head_dim}).permute({1, 2, 0, 3});
    case Layout::BSND:
      return x.transpose(1, 2);
    case Layout::BNSD:
      return x;
  }
  return x;
}

// flash.from_bnsd
at::Tensor from_bnsd(const at::Tensor& x, Layout layout) {
  const int64_t b = x.size(0), n = x.size(1), s = x.size(2), d = x.size(3);
  switch (layout) {
    case Layout::BSH:
      return x.transpose(1, 2).reshape({b, s, n * d});
    case Layout::SBH:
      return x.permute({2, 0, 1, 3}).reshape({s, b, n * d});
    case Layout::BSND:
      return x.transpose(1, 2).contiguous();
    case Layout::BNSD:
      return x.contiguous();
  }
  return x;
}

// flash._rows_per_block
int64_t rows_per_block(int64_t chunk_elements, int64_t b, int64_t n, int64_t s1, int64_t s2) {
  const int64_t rows = chunk_elements / std::max<int64_t>(1, b * n * s2);
  return std::min(std::max(kBlockRows, rows / kBlockRows * kBlockRows), std::max<int64_t>(s1, 1));
}

// Whether the statistics may be computed by the loops below (reading and writing memory
// directly) rather than by ATen ops: CPU tensors with real data and no TorchDispatchMode,
// which must see every op (the stream sanitizer, tracing). Both give the same bits.
bool direct_loops(const at::Tensor& x) {
  return x.device().is_cpu() && x.has_storage() && !x.key_set().has(c10::DispatchKey::Python) &&
         !x.key_set().has(c10::DispatchKey::Functionalize) && c10::impl::TorchDispatchModeTLS::stack_len() == 0;
}

// The max of row[0, n) (times sc first when Premul) as the loop `best = v > best ? v : best`
// from -inf computes it: four independent maxima (a max does not depend on the order, but
// for the sign of a zero, which the caller's + 0 erases). A row with a NaN is left to the
// sequential loop (*has_nan), which returns its first NaN.
template <bool Premul>
float row_max_no_nan(const float* row, int64_t n, float sc, bool* has_nan) {
  float b0 = -INFINITY, b1 = -INFINITY, b2 = -INFINITY, b3 = -INFINITY;
  bool nan = false;
  const auto at = [&](int64_t j) { return Premul ? row[j] * sc : row[j]; };
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    const float v0 = at(j), v1 = at(j + 1), v2 = at(j + 2), v3 = at(j + 3);
    nan |= (v0 != v0) | (v1 != v1) | (v2 != v2) | (v3 != v3);
    b0 = v0 > b0 ? v0 : b0;
    b1 = v1 > b1 ? v1 : b1;
    b2 = v2 > b2 ? v2 : b2;
    b3 = v3 > b3 ? v3 : b3;
  }
  for (; j < n; ++j) {
    const float v = at(j);
    nan |= v != v;
    b0 = v > b0 ? v : b0;
  }
  *has_nan = nan;
  b0 = b1 > b0 ? b1 : b0;
  b2 = b3 > b2 ? b3 : b2;
  return b2 > b0 ? b2 : b0;
}

// m[:, :, i0 + r] = the row max of block x as row_max's ATen ops compute it (j <= i0 + r
// when causal; the logits times scale first when scale <= 0, the max times scale after
// when scale > 0; then + 0): x float [b, n, rows, cols], m float [b, n, s1]. A NaN logit
// gives NaN, as amax does.
void block_row_max(const at::Tensor& x, at::Tensor& m, int64_t i0, bool causal, double scale) {
  const auto xa = x.accessor<float, 4>();
  auto ma = m.accessor<float, 3>();
  const float sc = static_cast<float>(scale);
  const int64_t rows = x.size(2), cols = x.size(3);
  const bool unit_stride = x.stride(3) == 1;
  for (int64_t bi = 0; bi < x.size(0); ++bi) {
    for (int64_t h = 0; h < x.size(1); ++h) {
      for (int64_t r = 0; r < rows; ++r) {
        const auto row = xa[bi][h][r];
        const int64_t limit = causal ? std::min(cols, i0 + r + 1) : cols;
        float best = -INFINITY;
        bool has_nan = true;
        if (unit_stride) {
          best = scale <= 0 ? row_max_no_nan<true>(row.data(), limit, sc, &has_nan)
                            : row_max_no_nan<false>(row.data(), limit, sc, &has_nan);
        }
        if (has_nan) {
          best = -INFINITY;
          for (int64_t j = 0; j < limit; ++j) {
            const float v = scale <= 0 ? row[j] * sc : row[j];
            if (std::isnan(v)) {
              best = v;
              break;
            }
            if (v > best) best = v;
          }
        }
        if (scale > 0) best = best * sc;
        ma[bi][h][i0 + r] = best + 0.0f;
      }
    }
  }
}

// flash._row_max (no grad): the row max of the scaled logits, j > i masked when causal; k
// may have fewer heads than q. A zero max is +0 (the sign of a zero max would depend on the
// order amax reduces in).
at::Tensor row_max(const at::Tensor& q, const at::Tensor& k, double scale, bool causal, int64_t chunk_elements) {
  const int64_t b = q.size(0), n = q.size(1), s1 = q.size(2), d = q.size(3);
  const int64_t n_kv = k.size(1), s2 = k.size(2);
  const at::Tensor kt = k.transpose(-1, -2);
  int64_t rows = rows_per_block(chunk_elements, b, n, s1, s2);
  if (causal) rows = std::min(rows, std::max(kCausalRows, (s1 + 7) / 8));
  const bool direct = q.scalar_type() == at::kFloat && direct_loops(q);
  at::Tensor m = direct ? at::empty({b, n, s1}, q.options()) : at::Tensor();
  std::vector<at::Tensor> parts;
  for (int64_t i0 = 0; i0 < s1; i0 += rows) {
    const int64_t i1 = std::min(s1, i0 + rows);
    const int64_t cols = causal ? std::min(s2, i1) : s2;
    const at::Tensor qb = q.slice(2, i0, i1).reshape({b, n_kv, (n / n_kv) * (i1 - i0), d});
    at::Tensor x = at::matmul(qb, kt.slice(-1, 0, cols)).view({b, n, i1 - i0, cols});
    if (direct) {
      block_row_max(x, m, i0, causal, scale);
      continue;
    }
    if (scale <= 0) x.mul_(scale);
    if (causal) {  // j > i to -inf (a NaN logit there does not reach the max)
      x.masked_fill_(at::ones({i1 - i0, cols}, x.options().dtype(at::kBool)).triu_(i0 + 1), -INFINITY);
    }
    parts.push_back(x.amax(-1));
  }
  if (direct) return m;
  m = parts.size() == 1 ? parts[0] : at::cat(parts, 2);
  if (scale > 0) m.mul_(scale);
  return m.add_(0.0);
}

// Plan.merge_stats for the fixed layouts: [B, N, S1] -> [B, N, S1, 8].
at::Tensor merge_stats(const at::Tensor& st, at::ScalarType dtype) {
  std::vector<int64_t> shape(st.sizes().begin(), st.sizes().end());
  shape.push_back(8);
  if (dtype == at::kFloat && st.scalar_type() == at::kFloat && st.dim() == 3 && direct_loops(st)) {
    at::Tensor out = at::empty(shape, st.options());
    const auto in = st.accessor<float, 3>();
    float* o = out.data_ptr<float>();
    for (int64_t bi = 0; bi < shape[0]; ++bi) {
      for (int64_t h = 0; h < shape[1]; ++h) {
        for (int64_t i = 0; i < shape[2]; ++i, o += 8) std::fill(o, o + 8, in[bi][h][i]);
      }
    }
    return out;
  }
  return st.to(dtype).unsqueeze(-1).expand(shape).contiguous();
}

// The arguments of a call one of the paths below takes, in [B, N, S, D] views.
struct Call {
  Layout layout;
  at::Tensor q, k, v;  // BNSD views of the inputs
  int64_t b, n, s1, n_kv, s2;
  bool causal;
};

// Plan's checks (layout.py) for the fixed layouts, and flash._sdpa_causal:
// nullopt for anything else (the Python engine then raises or runs it).
std::optional<Call> plain_call(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                               int64_t head_num, const std::string& input_layout,
                               const std::optional<at::Tensor>& atten_mask, double scale, int64_t sparse_mode) {
  const auto layout = parse_layout(input_layout);
  if (!layout || head_num <= 0 || sparse_mode < 0 || sparse_mode > 6) return std::nullopt;
  if (!query.defined() || !key.defined() || !value.defined()) return std::nullopt;
  const auto dtype = query.scalar_type();
  if (key.scalar_type() != dtype || value.scalar_type() != dtype) return std::nullopt;
  if (dtype != at::kFloat && dtype != at::kHalf && dtype != at::kBFloat16) return std::nullopt;
  if (query.device() != key.device() || query.device() != value.device()) return std::nullopt;
  if (key.sizes() != value.sizes()) return std::nullopt;
  const bool three_d = *layout == Layout::BSH || *layout == Layout::SBH;
  const int64_t dims = three_d ? 3 : 4;
  if (query.dim() != dims || key.dim() != dims) return std::nullopt;
  int64_t head_dim = 0;
  if (three_d) {
    if (query.size(2) % head_num != 0) return std::nullopt;
    head_dim = query.size(2) / head_num;
    if (head_dim == 0 || key.size(2) % head_dim != 0) return std::nullopt;
  } else {
    head_dim = query.size(3);
    if (key.size(3) != head_dim) return std::nullopt;
  }
  Call c{*layout, to_bnsd(query, *layout, head_dim), to_bnsd(key, *layout, head_dim),
         to_bnsd(value, *layout, head_dim), 0, 0, 0, 0, 0, false};
  c.b = c.q.size(0), c.n = c.q.size(1), c.s1 = c.q.size(2), c.n_kv = c.k.size(1), c.s2 = c.k.size(2);
  if (c.n != head_num || c.k.size(0) != c.b || c.n_kv <= 0 || c.n % c.n_kv != 0) return std::nullopt;
  if (c.s1 == 0 || c.s2 == 0 || c.v.size(3) != c.q.size(3)) return std::nullopt;
  if (atten_mask.has_value() && atten_mask->defined()) {
    const int64_t md = atten_mask->dim();
    if (md != 2 && md != 4) return std::nullopt;
    // (the CPU flash kernel's causal path returns NaN for scale <= 0)
    if ((sparse_mode == 2 || (sparse_mode == 3 && c.s1 == c.s2)) && scale > 0) {
      c.causal = true;
    } else {
      return std::nullopt;  // a mask SDPA cannot express: the Python engine
    }
  }
  return c;
}

at::Tensor in_float(const at::Tensor& t) { return t.scalar_type() == at::kFloat ? t : t.to(at::kFloat); }

// dropout_mask._block_seed: splitmix64-style mixing of (seed, offset, segment, block).
uint64_t block_seed(int64_t seed, int64_t offset, int64_t segment, int64_t block) {
  uint64_t x = static_cast<uint64_t>(seed) ^ (static_cast<uint64_t>(offset) * 0x9E3779B97F4A7C15ull) ^
               (static_cast<uint64_t>(segment) * 0xBF58476D1CE4E5B9ull) ^
               (static_cast<uint64_t>(block) * 0x94D049BB133111EBull);
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// dropout_mask.keep_rows for rows [0, s1) of segment 0: bool [b, n, s1, s2], True = kept.
at::Tensor keep_rows(int64_t seed, int64_t offset, int64_t b, int64_t n, int64_t s1, int64_t s2,
                     double keep_prob, const at::Device& device) {
  std::vector<at::Tensor> parts;
  for (int64_t block = 0; block < (s1 + kBlockRows - 1) / kBlockRows; ++block) {
    const int64_t b0 = block * kBlockRows;
    at::Generator gen = at::detail::createCPUGenerator(block_seed(seed, offset, 0, block));
    const at::Tensor u = at::rand({b, n, kBlockRows, s2}, gen, at::TensorOptions().dtype(at::kFloat));
    parts.push_back(u.slice(-2, 0, std::min(s1, b0 + kBlockRows) - b0).lt(keep_prob));
  }
  const at::Tensor keep = parts.size() == 1 ? parts[0] : at::cat(parts, -2);
  return keep.to(device);
}

// The fast path's forward on [B, N, S, D] views: the CPU flash kernel's output and
// log-sum-exp (differentiable when grad mode is on: its own derivative), the statistics, and
// the float32 [B, N, S, D] inputs the kernel read.
struct SdpaForward {
  at::Tensor out, lse, smax, ssum, q, k, v;
};
SdpaForward sdpa_forward(const Call& c, double scale, int64_t chunk_elements) {
  const at::Tensor qc = in_float(c.q), kc = in_float(c.k), vc = in_float(c.v);
  auto [out, lse] = at::_scaled_dot_product_flash_attention_for_cpu(qc, kc, vc, 0.0, c.causal, std::nullopt, scale);
  at::NoGradGuard no_grad;
  const at::Tensor m = row_max(qc, kc, scale, c.causal, chunk_elements);
  // sum_j exp(x_j - max) = exp(lse - max): no row is fully masked on this path
  const at::Tensor s = at::exp(lse - m);
  return SdpaForward{out, lse, merge_stats(m, at::kFloat), merge_stats(s, at::kFloat), qc, kc, vc};
}

}  // namespace

std::optional<FusionAttentionResult> fusion_attention_sdpa(const at::Tensor& query, const at::Tensor& key,
                                                           const at::Tensor& value, int64_t head_num,
                                                           const std::string& input_layout,
                                                           const std::optional<at::Tensor>& atten_mask,
                                                           double scale, int64_t sparse_mode,
                                                           int64_t chunk_elements) {
  auto c = plain_call(query, key, value, head_num, input_layout, atten_mask, scale, sparse_mode);
  if (!c) return std::nullopt;
  SdpaForward f = sdpa_forward(*c, scale, chunk_elements);
  at::Tensor result = from_bnsd(f.out, c->layout).to(query.scalar_type());
  return FusionAttentionResult{result, f.smax, f.ssum, query.new_empty({0}), c->b * c->n * c->s1 * c->s2};
}

bool fusion_attention_small_dropout_applies(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                                            int64_t head_num, const std::string& input_layout,
                                            const std::optional<at::Tensor>& atten_mask, double scale,
                                            int64_t sparse_mode, int64_t chunk_elements,
                                            int64_t small_elements) {
  auto c = plain_call(query, key, value, head_num, input_layout, atten_mask, scale, sparse_mode);
  return c && c->b * c->n * c->s1 * c->s2 <= small_elements &&
         rows_per_block(chunk_elements, c->b, c->n, c->s1, c->s2) >= c->s1;
}

namespace {

// flash.small_dropout_attention's forward on one of plain_call's calls, op for op, with
// at::matmul's steps spelled out (expand, reshape to 3-d, bmm), so that the one-node path can
// keep the operands its backward needs. With grad mode on, autograd records these ops (the
// ATen-op path); the one-node path runs it without recording and saves the operands.
struct SmallDropout {
  at::Tensor result, smax, ssum;
  // the bmm operands ([B*Nkv, rows, cols]), exp(x - max), its row sums, the dropped
  // positions and the causal mask (undefined when not causal)
  at::Tensor q3, k3, p3, v3, e, total, dropped, causal_mask;
};
SmallDropout small_dropout_forward(const Call& c, at::ScalarType dtype, double scale, double keep_prob, int64_t seed,
                                   int64_t offset) {
  const int64_t b = c.b, n = c.n, s1 = c.s1, s2 = c.s2, n_kv = c.n_kv, d = c.q.size(3), dv = c.v.size(3);
  const int64_t rows = (n / n_kv) * s1;
  SmallDropout f;
  const at::Tensor q = in_float(c.q), k = in_float(c.k), v = in_float(c.v);
  f.q3 = q.reshape({b, n_kv, rows, d}).expand({b, n_kv, rows, d}).reshape({b * n_kv, rows, d});
  f.k3 = k.transpose(-1, -2).expand({b, n_kv, d, s2}).reshape({b * n_kv, d, s2});
  at::Tensor x = at::bmm(f.q3, f.k3).view({b, n, s1, s2}).mul(scale);
  if (c.causal) {
    f.causal_mask = at::ones({s1, s2}, x.options().dtype(at::kBool)).triu_(1);
    x = x.masked_fill(f.causal_mask, -INFINITY);
  }
  const at::Tensor row_max = x.detach().amax(-1, /*keepdim=*/true);
  f.e = at::exp(x - row_max);
  f.total = f.e.sum(-1, /*keepdim=*/true);
  f.dropped = keep_rows(seed, offset, b, n, s1, s2, keep_prob, x.device()).bitwise_not();
  const at::Tensor p = (f.e / f.total).masked_fill(f.dropped, 0.0).mul(1.0 / keep_prob);
  f.p3 = p.reshape({b, n_kv, rows, s2}).expand({b, n_kv, rows, s2}).reshape({b * n_kv, rows, s2});
  f.v3 = v.expand({b, n_kv, s2, dv}).reshape({b * n_kv, s2, dv});
  const at::Tensor out = at::bmm(f.p3, f.v3).view({b, n, s1, dv});
  {
    at::NoGradGuard no_grad;
    f.smax = merge_stats(row_max.squeeze(-1), at::kFloat);
    f.ssum = merge_stats(f.total.detach().squeeze(-1), at::kFloat);
  }
  f.result = from_bnsd(out, c.layout).to(dtype);
  return f;
}

}  // namespace

FusionAttentionResult fusion_attention_small_dropout(const at::Tensor& query, const at::Tensor& key,
                                                     const at::Tensor& value, int64_t head_num,
                                                     const std::string& input_layout,
                                                     const std::optional<at::Tensor>& atten_mask, double scale,
                                                     int64_t sparse_mode, double keep_prob, int64_t seed,
                                                     int64_t offset) {
  auto c = plain_call(query, key, value, head_num, input_layout, atten_mask, scale, sparse_mode);
  TORCH_CHECK(c.has_value(), "fusion_attention_small_dropout: a call fusion_attention_small_dropout_applies refuses");
  SmallDropout f = small_dropout_forward(*c, query.scalar_type(), scale, keep_prob, seed, offset);
  return FusionAttentionResult{f.result, f.smax, f.ssum, query.new_empty({0}), c->b * c->n * c->s1 * c->s2};
}

namespace {

std::atomic<FlashSizes (*)()> flash_sizes_reader{nullptr};

// The Python kernel's _plain: a plain eager tensor (no FakeTensor / FunctionalTensor or other
// Python subclass with a dispatch key, whose symbolic sizes this path cannot read).
bool plain(const at::Tensor& t) {
  return !t.key_set().has(c10::DispatchKey::Python) && !t.unsafeGetTensorImpl()->has_symbolic_sizes_strides();
}

// q, k and v on one device (CPU, or one npu device) with real data (no fake, functional or
// functorch-wrapped tensor), and no TorchDispatchMode, which must see every ATen op (the
// stream sanitizer, tracing) and, when it records a graph, makes the Python kernel refuse a
// dropout draw.
bool real_eager_call(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  if (c10::impl::TorchDispatchModeTLS::stack_len() > 0) return false;
  const auto type = q.device().type();
  if (type != c10::DeviceType::CPU && type != c10::DeviceType::PrivateUse1) return false;
  for (const at::Tensor* t : {&q, &k, &v}) {
    if (t->device() != q.device() || has_no_real_data(*t)) return false;
  }
  return true;
}

// Whether a call takes a one-node path (one_node_call, one_node_dropout_call): a real eager
// call without forward-mode AD. Other calls run the same ATen ops with autograd recording
// them instead, bitwise alike.
bool takes_one_node(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  if (!real_eager_call(q, k, v)) return false;
  for (const at::Tensor* t : {&q, &k, &v}) {
    if (t->_fw_grad(/*level=*/0).defined()) return false;
  }
  return true;
}

// [B, N, S, D] gradient -> the input layout (the backward of to_bnsd's views).
at::Tensor grad_from_bnsd(const at::Tensor& g, Layout layout, at::IntArrayRef input_sizes) {
  switch (layout) {
    case Layout::BSH:
      return g.transpose(1, 2).reshape(input_sizes);
    case Layout::SBH:
      return g.permute({2, 0, 1, 3}).reshape(input_sizes);
    case Layout::BSND:
      return g.transpose(1, 2);
    case Layout::BNSD:
      return g;
  }
  return g;
}

const c10::OperatorHandle& grad_op() {
  static const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow("npu::npu_fusion_attention_grad", "");
  return op;
}

// The backward of one_node_call's result: the CPU flash kernel's own derivative with the
// layout and dtype steps around it undone, as autograd computes it through those ATen ops
// (the same values). On npu tensors it runs on CPU aliases as one npu kernel; under
// create_graph=True it runs as ATen ops, so that differentiating the gradients raises the
// flash backward's "derivative ... is not implemented", as the ATen-op path does.
struct FusionAttentionBackward final : torch::autograd::Node {
  std::string name() const override { return "NpuFusionAttentionBackward0"; }

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    torch::autograd::variable_list result(3);
    const at::Tensor& g = grads[0];
    if (!g.defined()) return result;
    std::array<at::Tensor, 5> t = {q_.unpack(), k_.unpack(), v_.unpack(), out_.unpack(getptr()), lse_.unpack()};
    std::tuple<at::Tensor, at::Tensor, at::Tensor> d;
    if (device_ >= 0 && !at::GradMode::is_enabled()) {
      AliasStorages storages;
      const at::Tensor ga = owning_alias(g, storages);
      for (auto& x : t) x = owning_alias(x, storages);
      {
        exec::KernelScope scope(grad_op(), device_);
        d = math(ga, t);
      }
      std::get<0>(d) = exec::share_result(std::get<0>(d), device_);
      std::get<1>(d) = exec::share_result(std::get<1>(d), device_);
      std::get<2>(d) = exec::share_result(std::get<2>(d), device_);
    } else {
      d = math(g, t);
    }
    if (should_compute_output(0)) result[0] = std::move(std::get<0>(d));
    if (should_compute_output(1)) result[1] = std::move(std::get<1>(d));
    if (should_compute_output(2)) result[2] = std::move(std::get<2>(d));
    return result;
  }

  void release_variables() override {
    q_.reset_data();
    k_.reset_data();
    v_.reset_data();
    out_.reset_data();
    lse_.reset_data();
  }

  // saved: q, k, v as given when float32 (in BNSD they are views of them, as autograd saves
  // them), else their float32 BNSD copies; the flash kernel's output and log-sum-exp
  torch::autograd::SavedVariable q_, k_, v_, out_, lse_;
  bool inputs_as_given = true;
  Layout layout = Layout::BNSD;
  int64_t head_dim = 0;
  bool causal = false;
  double scale = 1.0;
  int device_ = -1;  // the npu device, -1 for CPU tensors
  std::vector<int64_t> q_sizes, k_sizes, v_sizes;
  at::ScalarType q_dtype = at::kFloat, k_dtype = at::kFloat, v_dtype = at::kFloat;

 private:
  std::tuple<at::Tensor, at::Tensor, at::Tensor> math(const at::Tensor& g, const std::array<at::Tensor, 5>& t) const {
    const auto bnsd = [&](const at::Tensor& x) {
      return inputs_as_given ? to_bnsd(x, layout, head_dim) : x;
    };
    const at::Tensor gb = to_bnsd(in_float(g), layout, head_dim);
    auto [dq, dk, dv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
        gb, bnsd(t[0]), bnsd(t[1]), bnsd(t[2]), t[3], t[4], 0.0, causal, std::nullopt, scale);
    return {grad_from_bnsd(dq.to(q_dtype), layout, q_sizes), grad_from_bnsd(dk.to(k_dtype), layout, k_sizes),
            grad_from_bnsd(dv.to(v_dtype), layout, v_sizes)};
  }
};

// The fast path (plain_call's calls) as one autograd node: the forward runs its ATen ops
// without recording them (on npu tensors: on CPU aliases, as one npu kernel), and the result
// gets one FusionAttentionBackward node (NpuFusionAttentionBackward0, the real op's name).
// The same values as autograd through those ops (tested); nullopt for a call plain_call refuses.
std::optional<FusionAttentionResult> one_node_call(const c10::OperatorHandle& op, const at::Tensor& query,
                                                   const at::Tensor& key, const at::Tensor& value, int64_t head_num,
                                                   const std::string& input_layout,
                                                   const std::optional<at::Tensor>& atten_mask, double scale,
                                                   int64_t sparse_mode, int64_t chunk_elements) {
  const bool npu = query.device().type() == c10::DeviceType::PrivateUse1;
  const int device = npu ? query.device().index() : -1;
  AliasStorages storages;
  const auto alias = [&](const at::Tensor& t) { return npu ? owning_alias(t, storages) : t; };
  const at::Tensor q = alias(query), k = alias(key), v = alias(value);
  auto c = plain_call(q, k, v, head_num, input_layout, atten_mask, scale, sparse_mode);
  if (!c) return std::nullopt;
  const bool record =
      at::GradMode::is_enabled() && (query.requires_grad() || key.requires_grad() || value.requires_grad());
  const bool as_given = query.scalar_type() == at::kFloat;
  SdpaForward f;
  at::Tensor result, softmax_out;
  {
    std::optional<exec::KernelScope> scope;
    if (npu) scope.emplace(op, device);
    at::AutoGradMode no_grad(false);
    f = sdpa_forward(*c, scale, chunk_elements);
    result = from_bnsd(f.out, c->layout).to(query.scalar_type());
    softmax_out = q.new_empty({0});
  }
  const auto on_device = [&](const at::Tensor& t) { return npu && t.defined() ? exec::share_result(t, device) : t; };
  const bool result_is_out = result.is_same(f.out);
  FusionAttentionResult r{on_device(result), on_device(f.smax), on_device(f.ssum), on_device(softmax_out),
                          c->b * c->n * c->s1 * c->s2};
  if (!record) return r;
  at::Tensor& npu_result = std::get<0>(r);
  auto node = c10::make_intrusive<FusionAttentionBackward>();
  node->set_next_edges(torch::autograd::collect_next_edges(query, key, value));
  torch::autograd::set_history(npu_result, node);
  node->inputs_as_given = as_given;
  node->q_ = torch::autograd::SavedVariable(as_given ? query : on_device(f.q), false);
  node->k_ = torch::autograd::SavedVariable(as_given ? key : on_device(f.k), false);
  node->v_ = torch::autograd::SavedVariable(as_given ? value : on_device(f.v), false);
  node->out_ = result_is_out ? torch::autograd::SavedVariable(npu_result, true)
                             : torch::autograd::SavedVariable(on_device(f.out), false);
  node->lse_ = torch::autograd::SavedVariable(on_device(f.lse), false);
  node->layout = c->layout;
  node->head_dim = c->q.size(3);
  node->causal = c->causal;
  node->scale = scale;
  node->device_ = device;
  node->q_sizes = query.sizes().vec(), node->k_sizes = key.sizes().vec(), node->v_sizes = value.sizes().vec();
  node->q_dtype = query.scalar_type(), node->k_dtype = key.scalar_type(), node->v_dtype = value.scalar_type();
  return r;
}

// The backward of one_node_dropout_call's result: autograd's derivative of
// small_dropout_forward's ops, formula for formula and in the same order (bmm, mul, masked_fill,
// div, sum, exp), so the gradients are bitwise those of the ATen-op path. The operands are the
// forward's, kept as CPU aliases of the device memory (sharing the inputs' version counters),
// and it runs as one npu kernel (the path takes npu tensors only: draws_here). Under
// create_graph=True the gradients it returns carry a node that raises "derivative for
// npu::npu_fusion_attention_grad is not implemented" when differentiated, as the real op's
// backward has no derivative.
struct FusionAttentionDropoutBackward final : torch::autograd::Node {
  std::string name() const override { return "NpuFusionAttentionBackward0"; }

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    torch::autograd::variable_list result(3);
    const at::Tensor& g = grads[0];
    if (!g.defined()) return result;
    const bool create_graph = at::GradMode::is_enabled();
    std::array<at::Tensor, 3> d;
    {
      at::NoGradGuard no_grad;
      AliasStorages storages;
      const at::Tensor ga = owning_alias(g, storages);
      {
        exec::KernelScope scope(grad_op(), device_);
        d = math(ga);
      }
      for (auto& t : d) {
        if (t.defined()) t = exec::share_result(t, device_);
      }
    }
    c10::intrusive_ptr<torch::autograd::Node> not_implemented;
    if (create_graph) {
      not_implemented = c10::make_intrusive<torch::autograd::NotImplemented>("npu::npu_fusion_attention_grad",
                                                                          torch::autograd::collect_next_edges(g));
    }
    for (size_t i = 0; i < 3; ++i) {
      if (!should_compute_output(i) || !d[i].defined()) continue;
      if (not_implemented) torch::autograd::set_history(d[i], not_implemented);
      result[i] = std::move(d[i]);
    }
    return result;
  }

  void release_variables() override {
    for (auto* v : {&q3_, &k3_, &p3_, &v3_, &e_, &total_, &dropped_, &causal_mask_}) v->reset_data();
  }

  torch::autograd::SavedVariable q3_, k3_, p3_, v3_, e_, total_, dropped_, causal_mask_;
  Layout layout = Layout::BNSD;
  int64_t head_dim = 0, b = 0, n = 0, s1 = 0, n_kv = 0, s2 = 0;
  double scale = 1.0, keep_prob = 1.0;
  int device_ = 0;  // the npu device
  std::vector<int64_t> q_sizes, k_sizes, v_sizes;
  at::ScalarType q_dtype = at::kFloat, k_dtype = at::kFloat, v_dtype = at::kFloat;

 private:
  std::array<at::Tensor, 3> math(const at::Tensor& g) const {
    const int64_t rows = (n / n_kv) * s1, d = head_dim;
    const at::Tensor q3 = q3_.unpack(), k3 = k3_.unpack(), p3 = p3_.unpack(), v3 = v3_.unpack();
    const at::Tensor e = e_.unpack(), total = total_.unpack();
    const int64_t dv = v3.size(2);
    // from_bnsd and the dtype cast undone, then the output's view and _unsafe_view
    const at::Tensor go =
        to_bnsd(in_float(g), layout, head_dim).reshape({b, n_kv, rows, dv}).reshape({b * n_kv, rows, dv});
    std::array<at::Tensor, 3> out;
    if (should_compute_output(2)) {  // bmm(p3, v3): mat2
      const at::Tensor dv3 = p3.transpose(1, 2).bmm(go);
      out[2] = grad_from_bnsd(dv3.reshape({b, n_kv, s2, dv}).to(v_dtype), layout, v_sizes);
    }
    if (!should_compute_output(0) && !should_compute_output(1)) return out;
    // bmm(p3, v3): self; back through p's reshapes, the 1/keep_prob scaling and the dropout
    at::Tensor dp = go.bmm(v3.transpose(1, 2)).reshape({b, n_kv, rows, s2}).reshape({b, n, s1, s2});
    dp = dp.mul(1.0 / keep_prob).masked_fill(dropped_.unpack(), 0.0);
    // p = e / total: both operands; total = e.sum(-1, keepdim): its grad expanded; e's two
    // grads summed (the engine's input buffer)
    const at::Tensor de_div = dp / total;
    const at::Tensor dtotal = (-dp * ((e / total) / total)).sum(-1, /*keepdim=*/true);
    at::Tensor dx = (de_div + dtotal.expand({b, n, s1, s2})) * e;  // exp: grad * result; x - max: grad
    const at::Tensor causal_mask = causal_mask_.unpack();
    if (causal_mask.defined()) dx = dx.masked_fill(causal_mask, 0.0);
    const at::Tensor dx3 = dx.mul(scale).reshape({b, n_kv, rows, s2}).reshape({b * n_kv, rows, s2});
    if (should_compute_output(0)) {  // bmm(q3, k3): self
      const at::Tensor dq3 = dx3.bmm(k3.transpose(1, 2));
      out[0] = grad_from_bnsd(dq3.reshape({b, n_kv, rows, d}).reshape({b, n, s1, d}).to(q_dtype), layout, q_sizes);
    }
    if (should_compute_output(1)) {  // bmm(q3, k3): mat2, then k's transpose
      const at::Tensor dk3 = q3.transpose(1, 2).bmm(dx3);
      out[1] = grad_from_bnsd(dk3.reshape({b, n_kv, d, s2}).transpose(-1, -2).to(k_dtype), layout, k_sizes);
    }
    return out;
  }
};

// fusion_attention_small_dropout's calls on npu tensors as one autograd node, as one_node_call
// does for the calls without dropout: the forward unrecorded on CPU aliases, as one npu kernel,
// and one FusionAttentionDropoutBackward node. The caller has checked the call
// (fusion_attention_small_dropout_applies) and drawn the (seed, offset) pair.
FusionAttentionResult one_node_dropout_call(const c10::OperatorHandle& op, const at::Tensor& query,
                                            const at::Tensor& key, const at::Tensor& value, int64_t head_num,
                                            const std::string& input_layout,
                                            const std::optional<at::Tensor>& atten_mask, double scale,
                                            int64_t sparse_mode, double keep_prob, int64_t seed, int64_t offset) {
  const int device = query.device().index();
  AliasStorages storages;
  const auto c = plain_call(owning_alias(query, storages), owning_alias(key, storages),
                            owning_alias(value, storages), head_num, input_layout, atten_mask, scale, sparse_mode);
  TORCH_CHECK(c.has_value(), "one_node_dropout_call: a call fusion_attention_small_dropout_applies refuses");
  const Call& call = *c;
  const bool record =
      at::GradMode::is_enabled() && (query.requires_grad() || key.requires_grad() || value.requires_grad());
  SmallDropout f;
  at::Tensor softmax_out;
  {
    exec::KernelScope scope(op, device);
    at::AutoGradMode no_grad(false);
    f = small_dropout_forward(call, query.scalar_type(), scale, keep_prob, seed, offset);
    softmax_out = call.q.new_empty({0});
  }
  const auto on_device = [&](const at::Tensor& t) { return exec::share_result(t, device); };
  FusionAttentionResult r{on_device(f.result), on_device(f.smax), on_device(f.ssum), on_device(softmax_out),
                          call.b * call.n * call.s1 * call.s2};
  if (!record) return r;
  auto node = c10::make_intrusive<FusionAttentionDropoutBackward>();
  node->set_next_edges(torch::autograd::collect_next_edges(query, key, value));
  torch::autograd::set_history(std::get<0>(r), node);
  const auto save = [](const at::Tensor& t) { return torch::autograd::SavedVariable(t, false); };
  node->q3_ = save(f.q3), node->k3_ = save(f.k3), node->p3_ = save(f.p3), node->v3_ = save(f.v3);
  node->e_ = save(f.e), node->total_ = save(f.total), node->dropped_ = save(f.dropped);
  if (f.causal_mask.defined()) node->causal_mask_ = save(f.causal_mask);
  node->layout = call.layout;
  node->head_dim = call.q.size(3);
  node->b = call.b, node->n = call.n, node->s1 = call.s1, node->n_kv = call.n_kv, node->s2 = call.s2;
  node->scale = scale, node->keep_prob = keep_prob;
  node->device_ = device;
  node->q_sizes = query.sizes().vec(), node->k_sizes = key.sizes().vec(), node->v_sizes = value.sizes().vec();
  node->q_dtype = query.scalar_type(), node->k_dtype = key.scalar_type(), node->v_dtype = value.scalar_type();
  return r;
}

// dropout_mask.draw_seed_offset for a call on npu device `device`: (seed, offset) from its
// default generator, whose offset advances by dropout_mask._OFFSET_STEP (the generator's
// unsigned halves read as int64, as the Python helper returns them).
constexpr uint64_t kOffsetStep = 10;
std::pair<int64_t, int64_t> draw_seed_offset(c10::DeviceIndex device) {
  at::Generator gen = torch_npu::default_generator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  auto* impl = gen.get<torch_npu::NPUGeneratorImpl>();
  const uint64_t seed = impl->current_seed(), offset = impl->get_offset();
  impl->set_offset(offset + kOffsetStep);
  return {static_cast<int64_t>(seed), static_cast<int64_t>(offset)};
}

// Whether a dropout call may draw its seed here rather than in the Python kernel: a real eager
// call on npu tensors (the device, and so its generator and any manual_seed queued before it,
// is initialised).
bool draws_here(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  return q.device().type() == c10::DeviceType::PrivateUse1 && real_eager_call(q, k, v);
}

// The schema's argument positions (npu_fusion_attention(query, key, value, head_num,
// input_layout, pse, padding_mask, atten_mask, scale, keep_prob, pre_tockens, next_tockens,
// inner_precise, prefix, actual_seq_qlen, actual_seq_kvlen, sparse_mode, gen_mask_parallel,
// sync, softmax_layout, sink, dropout_mask, seed, offset)).
constexpr size_t kArgs = 24;
enum Arg : size_t {
  kQuery = 0, kKey = 1, kValue = 2, kHeadNum = 3, kLayout = 4, kPse = 5, kPaddingMask = 6, kAttenMask = 7,
  kScale = 8, kKeepProb = 9, kPrefix = 13, kSeqQ = 14, kSeqKv = 15, kSparseMode = 16, kSink = 20, kDropoutMask = 21,
};

// npu::npu_fusion_attention at the Autograd keys of CPU and npu: the common case (no pse, no
// mask or a top-left causal one; see fusion_attention_sdpa) without dropout, and on npu
// tensors with dropout on a small call (fusion_attention_small_dropout), runs here without
// the Python kernel's per-call cost (boxing two dozen arguments into Python and back); every
// other call, and every argument error, goes to the Python CompositeImplicitAutograd kernel
// exactly as if this kernel did not exist. The op keeps no backend-key kernel (the registry's
// rule for emulated ops), so under inference mode, which skips the Autograd keys, the Python
// kernel runs it (it then calls fusion_attention_sdpa / fusion_attention_small_dropout).
void fusion_attention_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  auto args = torch::jit::last(*stack, kArgs);
  const auto tensor = [&](size_t i) -> const at::Tensor* {
    const c10::IValue& a = args[i];
    return a.isTensor() && plain(a.toTensor()) ? &a.toTensor() : nullptr;
  };
  const at::Tensor* q = tensor(kQuery);
  const at::Tensor* k = tensor(kKey);
  const at::Tensor* v = tensor(kValue);
  const c10::IValue& mask = args[kAttenMask];
  auto reader = flash_sizes_reader.load(std::memory_order_acquire);
  if (q && k && v && reader && args[kPse].isNone() && args[kPaddingMask].isNone() && args[kPrefix].isNone() &&
      args[kSeqQ].isNone() && args[kSeqKv].isNone() && args[kSink].isNone() && args[kDropoutMask].isNone() &&
      args[kKeepProb].isDouble() && args[kHeadNum].isInt() && args[kScale].isDouble() && args[kSparseMode].isInt() &&
      args[kLayout].isString() && (mask.isNone() || tensor(kAttenMask))) {
    std::optional<at::Tensor> atten_mask;
    if (!mask.isNone()) atten_mask = mask.toTensor();
    const int64_t head_num = args[kHeadNum].toInt(), sparse_mode = args[kSparseMode].toInt();
    const std::string& layout = args[kLayout].toStringRef();
    const double scale = args[kScale].toDouble(), keep_prob = args[kKeepProb].toDouble();
    std::optional<FusionAttentionResult> r;
    int64_t seed = 0, offset = 0;
    if (keep_prob == 1.0) {
      const int64_t chunk = reader().chunk_elements;
      r = takes_one_node(*q, *k, *v)
              ? one_node_call(op, *q, *k, *v, head_num, layout, atten_mask, scale, sparse_mode, chunk)
              : fusion_attention_sdpa(*q, *k, *v, head_num, layout, atten_mask, scale, sparse_mode, chunk);
    } else if (keep_prob > 0 && keep_prob < 1 && draws_here(*q, *k, *v)) {
      // the Python kernel's small-dropout path: checks, then the draw, then the same ATen ops
      // (autograd records them, as under the Python kernel)
      const FlashSizes sizes = reader();
      if (fusion_attention_small_dropout_applies(*q, *k, *v, head_num, layout, atten_mask, scale, sparse_mode,
                                                 sizes.chunk_elements, sizes.small_elements)) {
        std::tie(seed, offset) = draw_seed_offset(q->device().index());
        r = takes_one_node(*q, *k, *v) ? one_node_dropout_call(op, *q, *k, *v, head_num, layout, atten_mask, scale,
                                                               sparse_mode, keep_prob, seed, offset)
                                       : fusion_attention_small_dropout(*q, *k, *v, head_num, layout, atten_mask,
                                                                        scale, sparse_mode, keep_prob, seed, offset);
      }
    }
    if (r) {
      auto& [out, smax, ssum, softmax_out, numels] = *r;
      torch::jit::drop(*stack, kArgs);
      torch::jit::push(*stack, std::move(out), std::move(smax), std::move(ssum), std::move(softmax_out), seed,
                       offset, numels);
      return;
    }
  }
  op.callBoxedForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd, *stack);
}

}  // namespace

void set_flash_sizes_reader(FlashSizes (*reader)()) {
  flash_sizes_reader.store(reader, std::memory_order_release);
}

TORCH_LIBRARY_IMPL(npu, AutogradCPU, m) {
  m.impl("npu_fusion_attention", torch::CppFunction::makeFromBoxedFunction<&fusion_attention_kernel>());
}
TORCH_LIBRARY_IMPL(npu, AutogradPrivateUse1, m) {
  m.impl("npu_fusion_attention", torch::CppFunction::makeFromBoxedFunction<&fusion_attention_kernel>());
}

}  // namespace torch_npu::kernels
