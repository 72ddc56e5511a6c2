// An npu op that runs its CPU implementation on zero-copy CPU aliases and,
// when a gradient is needed, lets that call record its own CPU autograd
// graph; one npu node (CpuGraphBackward) links the npu outputs to the npu
// inputs and runs that graph's backward on aliases of the incoming
// gradients. Used by the RNN kernels (RnnKernels.cpp): the forward and
// backward run the very CPU kernels the CPU runs, without an npu kernel call
// per ATen op. npu_fusion_attention's fast path (FusionAttentionSdpa.cpp)
// uses the owning aliases with a backward node of its own.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Storage.h>
#include <torch/csrc/autograd/function.h>

#include <string>
#include <utility>
#include <vector>

namespace torch_npu::kernels {

// The CPU storages made for one call, by npu storage (aliases of one npu
// storage share one CPU storage within a call).
using AliasStorages = std::vector<std::pair<c10::StorageImpl*, c10::Storage>>;

// A CPU alias of npu tensor `t` that keeps the npu memory alive (the CPU
// graph may save it past the call) and shares t's version counter, so an
// in-place change of the npu tensor before backward is detected by the CPU
// graph as it would be on CPU.
at::Tensor owning_alias(const at::Tensor& t, AliasStorages& storages);

// The inputs of one call that may record a CPU graph: `alias` makes each
// npu input's owning alias; when recording and the input requires grad, the
// alias is made to require grad too and the pair is kept (npu_inputs become
// the node's next edges, cpu_inputs what the CPU graph is differentiated to).
struct CpuGraphInputs {
  explicit CpuGraphInputs(bool record) : record(record) {}
  at::Tensor alias(const at::Tensor& t);

  bool record;
  AliasStorages storages;
  torch::autograd::variable_list npu_inputs, cpu_inputs;
};

// Tensors a CPU kernel cannot read: fake, functional, meta-backed, subclasses.
bool has_no_real_data(const at::Tensor& t);

// The npu end of a CPU autograd graph recorded by one call: its inputs are
// the npu outputs (`cpu_outputs` are their CPU counterparts, in order), its
// next edges the npu inputs that require grad (`cpu_inputs` their aliases,
// in order). The graph is released with the node, so a retained outer graph
// can run it again. Under create_graph=True it raises "<name>: double backward
// (create_graph=True) through <what> on the NPU is not supported".
struct CpuGraphBackward final : torch::autograd::Node {
  CpuGraphBackward(std::string name, int device, torch::autograd::variable_list cpu_inputs,
                   torch::autograd::variable_list cpu_outputs, std::string what);

  std::string name() const override { return name_; }
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override;
  void release_variables() override;

 private:
  std::string name_;
  int device_;
  torch::autograd::variable_list cpu_inputs_;
  torch::autograd::variable_list cpu_outputs_;
  std::string what_;
  bool released_ = false;
};

}  // namespace torch_npu::kernels
