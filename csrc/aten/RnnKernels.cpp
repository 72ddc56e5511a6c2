// nn.LSTM / nn.GRU / nn.RNN and their cells on npu compute bitwise what the
// CPU computes, forward and backward. ATen's RNN code picks the fused-cell
// path (_thnn_fused_*_cell) for PrivateUse1 inputs and oneDNN or the unfused
// cells for CPU inputs, so the composite kernels would round differently.
// Instead, aten::lstm / gru / rnn_tanh / rnn_relu (both overloads) and the
// four *_cell ops get npu kernels at PrivateUse1 and AutogradPrivateUse1
// that run the CPU implementation on zero-copy CPU aliases of the npu
// tensors, allocations served from the device pool. When a gradient is
// needed, the CPU call records its own CPU autograd graph; one npu node
// (CpuGraphBackward, aten/CpuGraph.h) links the npu outputs to the npu inputs and runs that
// graph's backward on aliases of the incoming gradients.
//
// Dropout between layers must draw from the npu generator: a multi-layer
// call with dropout in training is run layer by layer (each layer is the
// same CPU computation as inside the multi-layer call) with npu dropout
// between the layers, exactly where ATen applies it.
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/dropout.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/library.h>

#include <string>
#include <utility>
#include <vector>

#include "aten/CpuGraph.h"
#include "aten/OpExecution.h"

namespace torch_npu::kernels {
namespace {

using torch::autograd::variable_list;

std::string backward_name(const c10::OperatorHandle& op) {
  const auto& n = op.operator_name();
  std::string base = n.name.substr(n.name.find("::") + 2);
  std::string out;
  bool up = true;
  for (char c : base) {
    if (c == '_') {
      up = true;
      continue;
    }
    out += up ? static_cast<char>(std::toupper(static_cast<unsigned char>(c))) : c;
    up = false;
  }
  return out + "NpuBackward0";
}

template <typename F>
void for_each_tensor(const torch::jit::Stack& stack, size_t base, size_t n, F&& f) {
  for (size_t i = base; i < base + n; ++i) {
    const c10::IValue& iv = stack[i];
    if (iv.isTensor()) {
      f(iv.toTensor());
    } else if (iv.isTensorList()) {
      for (const at::Tensor& t : iv.toTensorList()) f(t);
    }
  }
}

// Runs the op's CPU implementation on aliases; records the CPU graph and an
// npu backward node when `autograd` and a tensor input requires grad.
void run_cpu_implementation(const c10::OperatorHandle& op, torch::jit::Stack* stack, bool autograd) {
  const auto& schema = op.schema();
  const size_t nargs = schema.arguments().size();
  const size_t base = stack->size() - nargs;

  bool record = false;
  if (autograd && at::GradMode::is_enabled()) {
    for_each_tensor(*stack, base, nargs, [&](const at::Tensor& t) {
      if (t.defined() && t.requires_grad()) record = true;
      TORCH_CHECK(!t.defined() || !t._fw_grad(/*level=*/0).defined(), op.operator_name().name,
                  ": forward-mode AD is not supported for RNNs on the NPU");
    });
  }

  // batch_sizes (packed sequences) stays a CPU tensor, as on CUDA.
  int batch_sizes_arg = -1;
  c10::IValue batch_sizes;
  for (size_t i = 0; i < nargs; ++i) {
    if (schema.arguments()[i].name() == "batch_sizes") {
      batch_sizes_arg = static_cast<int>(i);
      batch_sizes = std::move((*stack)[base + i]);
      (*stack)[base + i] = at::Tensor();
    }
  }

  CpuGraphInputs inputs(record);
  const int device = exec::prepare_cpu_call(
      op, stack, [&](const at::Tensor& t, const c10::Argument&) { return inputs.alias(t); });
  if (batch_sizes_arg >= 0) {
    c10::IValue& slot = (*stack)[base + batch_sizes_arg];
    const at::Tensor& bs = batch_sizes.toTensor();
    slot = bs.device().type() == c10::DeviceType::PrivateUse1 ? c10::IValue(exec::cpu_alias(bs)) : batch_sizes;
  }

  {
    exec::KernelScope scope(op, device);
    at::AutoGradMode grad_mode(record);
    op.callBoxed(stack);
  }

  const size_t nout = schema.returns().size();
  const size_t obase = stack->size() - nout;
  variable_list cpu_outputs, npu_outputs;
  for (size_t i = 0; i < nout; ++i) {
    at::Tensor cpu = (*stack)[obase + i].toTensor();
    at::Tensor npu = exec::share_result(cpu, device);
    if (record && !npu.is_inference()) {
      npu.unsafeGetTensorImpl()->set_version_counter(cpu.unsafeGetTensorImpl()->version_counter());
    }
    cpu_outputs.push_back(cpu);
    npu_outputs.push_back(npu);
    (*stack)[obase + i] = npu;
  }
  if (!record) return;
  auto node = c10::make_intrusive<CpuGraphBackward>(backward_name(op), device, std::move(inputs.cpu_inputs),
                                                     std::move(cpu_outputs), "an RNN");
  node->set_next_edges(torch::autograd::collect_next_edges(inputs.npu_inputs));
  for (const at::Tensor& out : npu_outputs) torch::autograd::set_history(out, node);
}

struct LayerArgs {
  size_t hx = 0;  // index of hx (Tensor for gru/rnn, Tensor[] for lstm)
  bool valid = false;
};

// Argument layout of the multi-layer overloads:
//   .input: (input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first)
//   .data:  (data, batch_sizes, hx, params, has_biases, num_layers, dropout, train, bidirectional)
LayerArgs layer_args(const c10::OperatorHandle& op) {
  const auto& args = op.schema().arguments();
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].name() == "hx") return {i, i + 7 <= args.size() && args[i + 3].name() == "num_layers"};
  }
  return {};
}

// A multi-layer call with dropout in training: one call per layer, npu
// dropout between layers (the npu generator draws the masks).
bool run_layer_by_layer(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const LayerArgs la = layer_args(op);
  if (!la.valid) return false;
  const size_t nargs = op.schema().arguments().size();
  const size_t base = stack->size() - nargs;
  auto arg = [&](size_t i) -> c10::IValue& { return (*stack)[base + i]; };
  const int64_t num_layers = arg(la.hx + 3).toInt();
  const double p = arg(la.hx + 4).toDouble();
  const bool train = arg(la.hx + 5).toBool();
  const bool bidirectional = arg(la.hx + 6).toBool();
  if (!(train && p > 0 && num_layers > 1)) return false;

  const int64_t dirs = bidirectional ? 2 : 1;
  const bool lstm_hx = arg(la.hx).isTensorList();
  std::vector<at::Tensor> hx = lstm_hx ? arg(la.hx).toTensorVector() : std::vector<at::Tensor>{arg(la.hx).toTensor()};
  std::vector<at::Tensor> params = arg(la.hx + 1).toTensorVector();
  TORCH_CHECK(num_layers > 0 && params.size() % num_layers == 0, op.operator_name().name,
              ": got ", params.size(), " parameters for ", num_layers, " layers");
  const size_t per_layer = params.size() / num_layers;

  std::vector<c10::IValue> fixed(stack->end() - nargs, stack->end());
  torch::jit::drop(*stack, nargs);
  at::Tensor layer_input = fixed[0].toTensor();
  std::vector<std::vector<at::Tensor>> final_states(hx.size());
  for (int64_t l = 0; l < num_layers; ++l) {
    std::vector<c10::IValue> call = fixed;
    call[0] = layer_input;
    std::vector<at::Tensor> layer_hx;
    for (const at::Tensor& h : hx) layer_hx.push_back(h.narrow(0, l * dirs, dirs));
    call[la.hx] = lstm_hx ? c10::IValue(layer_hx) : c10::IValue(layer_hx[0]);
    call[la.hx + 1] = std::vector<at::Tensor>(params.begin() + l * per_layer, params.begin() + (l + 1) * per_layer);
    call[la.hx + 3] = int64_t{1};
    call[la.hx + 4] = 0.0;
    torch::jit::Stack s(call.begin(), call.end());
    op.callBoxed(&s);
    layer_input = s[0].toTensor();
    for (size_t k = 0; k < hx.size(); ++k) final_states[k].push_back(s[1 + k].toTensor());
    if (l + 1 < num_layers) layer_input = at::dropout(layer_input, p, /*train=*/true);
  }
  torch::jit::push(*stack, layer_input);
  for (auto& states : final_states) torch::jit::push(*stack, at::cat(states, 0));
  return true;
}

bool needs_composite(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const size_t nargs = op.schema().arguments().size();
  bool fake = false;
  for_each_tensor(stack, stack.size() - nargs, nargs, [&](const at::Tensor& t) { fake = fake || has_no_real_data(t); });
  return fake;
}

// torch_npu's autocast list has no RNN rule: nn.LSTM/GRU reach their npu
// kernels (the real package has them) in the dtype they are given. rnn_tanh and
// rnn_relu have no npu kernel on the device, so there ATen's composite runs,
// and under torch.autocast("npu") its linear/addmm calls are cast by their
// own rows; running the composite here gives the same casts.
bool decomposes_under_autocast(const c10::OperatorHandle& op) {
  const std::string& name = op.schema().name();
  return (name == "aten::rnn_tanh" || name == "aten::rnn_relu") &&
         at::autocast::is_autocast_enabled(c10::DeviceType::PrivateUse1);
}

void rnn_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack, bool autograd) {
  if (run_layer_by_layer(op, stack)) return;
  run_cpu_implementation(op, stack, autograd);
}

void rnn_npu(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  if (needs_composite(op, *stack) || decomposes_under_autocast(op)) {
    op.callBoxedForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd, *stack);
    return;
  }
  rnn_kernel(op, stack, /*autograd=*/false);
}

void rnn_autograd_npu(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  if (needs_composite(op, *stack) || decomposes_under_autocast(op)) {
    // Fake or functional tensors outside the Python dispatcher: ATen's
    // composite. (Under torch.compile's tracing the Python dispatcher runs
    // torch._decomp's RNN decompositions instead, see
    // torch_npu/utils/_rnn_decompositions.py.)
    op.callBoxedForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd, *stack);
    return;
  }
  rnn_kernel(op, stack, /*autograd=*/true);
}

constexpr const char* kRnnOps[] = {"lstm.input",     "lstm.data",     "gru.input",  "gru.data",
                                   "rnn_tanh.input", "rnn_tanh.data", "rnn_relu.input", "rnn_relu.data",
                                   "lstm_cell",      "gru_cell",      "rnn_tanh_cell", "rnn_relu_cell"};

}  // namespace
}  // namespace torch_npu::kernels

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  for (const char* name : torch_npu::kernels::kRnnOps) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&torch_npu::kernels::rnn_npu>());
  }
}

TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  for (const char* name : torch_npu::kernels::kRnnOps) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&torch_npu::kernels::rnn_autograd_npu>());
  }
}
