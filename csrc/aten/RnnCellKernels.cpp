// The fused-cell ops (_thnn_fused_*_cell) that ATen's RNN code uses on CUDA,
// callable directly on npu as on CUDA. nn.LSTM / nn.GRU and the cells do not
// reach them on npu (RnnKernels.cpp runs the CPU implementation instead).
// These kernels compute the same gate math with ATen CPU ops on zero-copy
// aliases. Workspace layouts
// follow CUDA's: LSTM [i, f, g, o] activated gates; GRU [r, z, n, hx, hn].
#include <ATen/ops/cat.h>
#include <ATen/ops/zeros_like.h>
#include <ATen/TensorOperators.h>
#include <torch/library.h>

#include "aten/OpExecution.h"

namespace torch_npu::kernels {
namespace {

using exec::adopt_result;
using exec::cpu_alias;

at::Tensor alias_or_undefined(const std::optional<at::Tensor>& t) {
  return (t.has_value() && t->defined()) ? cpu_alias(*t) : at::Tensor();
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_lstm_cell(const at::Tensor& input_gates,
                                                               const at::Tensor& hidden_gates, const at::Tensor& cx,
                                                               const std::optional<at::Tensor>& input_bias,
                                                               const std::optional<at::Tensor>& hidden_bias) {
  int d = input_gates.device().index();
  at::Tensor hy, cy, ws;
  {
    NPU_KERNEL_SCOPE("aten::_thnn_fused_lstm_cell", "", d);
    at::Tensor gates = cpu_alias(input_gates) + cpu_alias(hidden_gates);
    at::Tensor ib = alias_or_undefined(input_bias), hb = alias_or_undefined(hidden_bias);
    if (ib.defined()) gates = gates + ib;
    if (hb.defined()) gates = gates + hb;
    auto chunks = gates.chunk(4, 1);
    at::Tensor i = chunks[0].sigmoid(), f = chunks[1].sigmoid(), g = chunks[2].tanh(), o = chunks[3].sigmoid();
    cy = f * cpu_alias(cx) + i * g;
    hy = o * cy.tanh();
    ws = at::cat({i, f, g, o}, 1);
  }
  return {adopt_result(hy, d), adopt_result(cy, d), adopt_result(ws, d)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_lstm_cell_backward_impl(
    const std::optional<at::Tensor>& grad_hy, const std::optional<at::Tensor>& grad_cy, const at::Tensor& cx,
    const at::Tensor& cy, const at::Tensor& workspace, bool has_bias) {
  int d = workspace.device().index();
  at::Tensor ggates, gcx, gbias;
  {
    NPU_KERNEL_SCOPE("aten::_thnn_fused_lstm_cell_backward_impl", "", d);
    at::Tensor ws = cpu_alias(workspace), c = cpu_alias(cy), cprev = cpu_alias(cx);
    auto chunks = ws.chunk(4, 1);
    at::Tensor i = chunks[0], f = chunks[1], g = chunks[2], o = chunks[3];
    at::Tensor tcy = c.tanh();
    at::Tensor ghy = alias_or_undefined(grad_hy), gcy = alias_or_undefined(grad_cy);
    if (!ghy.defined()) ghy = at::zeros_like(c);
    at::Tensor gc = ghy * o * (1 - tcy * tcy);
    if (gcy.defined()) gc = gc + gcy;
    at::Tensor di = gc * g * i * (1 - i);
    at::Tensor df = gc * cprev * f * (1 - f);
    at::Tensor dg = gc * i * (1 - g * g);
    at::Tensor dout = ghy * tcy * o * (1 - o);
    ggates = at::cat({di, df, dg, dout}, 1);
    gcx = gc * f;
    if (has_bias) gbias = ggates.sum(0, /*keepdim=*/false);
  }
  return {adopt_result(ggates, d), adopt_result(gcx, d), adopt_result(gbias, d)};
}

std::tuple<at::Tensor, at::Tensor> fused_gru_cell(const at::Tensor& input_gates, const at::Tensor& hidden_gates,
                                                  const at::Tensor& hx, const std::optional<at::Tensor>& input_bias,
                                                  const std::optional<at::Tensor>& hidden_bias) {
  int d = input_gates.device().index();
  at::Tensor hy, ws;
  {
    NPU_KERNEL_SCOPE("aten::_thnn_fused_gru_cell", "", d);
    at::Tensor ig = cpu_alias(input_gates), hg = cpu_alias(hidden_gates), h = cpu_alias(hx);
    at::Tensor ib = alias_or_undefined(input_bias), hb = alias_or_undefined(hidden_bias);
    if (ib.defined()) ig = ig + ib;
    if (hb.defined()) hg = hg + hb;
    auto ic = ig.chunk(3, 1);
    auto hc = hg.chunk(3, 1);
    at::Tensor r = (ic[0] + hc[0]).sigmoid();
    at::Tensor z = (ic[1] + hc[1]).sigmoid();
    at::Tensor n = (ic[2] + r * hc[2]).tanh();
    hy = n + z * (h - n);
    ws = at::cat({r, z, n, h, hc[2]}, 1);
  }
  return {adopt_result(hy, d), adopt_result(ws, d)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> fused_gru_cell_backward(
    const at::Tensor& grad_hy, const at::Tensor& workspace, bool has_bias) {
  int d = workspace.device().index();
  at::Tensor gig, ghg, ghx, gib, ghb;
  {
    NPU_KERNEL_SCOPE("aten::_thnn_fused_gru_cell_backward", "", d);
    auto w = cpu_alias(workspace).chunk(5, 1);
    at::Tensor r = w[0], z = w[1], n = w[2], h = w[3], hn = w[4];
    at::Tensor g = cpu_alias(grad_hy);
    ghx = g * z;
    at::Tensor dz = g * (h - n) * z * (1 - z);
    at::Tensor dn = g * (1 - z) * (1 - n * n);
    at::Tensor dr = dn * hn * r * (1 - r);
    gig = at::cat({dr, dz, dn}, 1);
    ghg = at::cat({dr, dz, dn * r}, 1);
    if (has_bias) {
      gib = gig.sum(0, false);
      ghb = ghg.sum(0, false);
    }
  }
  return {adopt_result(gig, d), adopt_result(ghg, d), adopt_result(ghx, d), adopt_result(gib, d),
          adopt_result(ghb, d)};
}

}  // namespace
}  // namespace torch_npu::kernels

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  using namespace torch_npu::kernels;
  m.impl("_thnn_fused_lstm_cell", &fused_lstm_cell);
  m.impl("_thnn_fused_lstm_cell_backward_impl", &fused_lstm_cell_backward_impl);
  m.impl("_thnn_fused_gru_cell", &fused_gru_cell);
  m.impl("_thnn_fused_gru_cell_backward", &fused_gru_cell_backward);
}
