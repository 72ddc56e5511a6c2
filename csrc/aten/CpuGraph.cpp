// CPU autograd graphs behind one npu node: see CpuGraph.h.
#include "aten/CpuGraph.h"

#include <c10/core/GradMode.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/autograd/autograd.h>

#include "aten/OpExecution.h"

namespace torch_npu::kernels {
namespace {

void release_npu_storage(void* ctx) { c10::raw::intrusive_ptr::decref(static_cast<c10::StorageImpl*>(ctx)); }

}  // namespace

at::Tensor owning_alias(const at::Tensor& t, AliasStorages& storages) {
  c10::StorageImpl* s = t.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl();
  c10::Storage cpu;
  for (auto& e : storages) {
    if (e.first == s) cpu = e.second;
  }
  if (!cpu) {
    c10::raw::intrusive_ptr::incref(s);
    c10::DataPtr dp(const_cast<void*>(s->data()), s, &release_npu_storage, c10::Device(c10::DeviceType::CPU));
    cpu = c10::Storage(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), s->sym_nbytes(),
                                                             std::move(dp), nullptr, /*resizable=*/false));
    storages.emplace_back(s, cpu);
  }
  at::Tensor a = exec::cpu_alias(t, std::move(cpu));
  if (!t.is_inference() && !a.is_inference()) {
    a.unsafeGetTensorImpl()->set_version_counter(t.unsafeGetTensorImpl()->version_counter());
  }
  return a;
}

at::Tensor CpuGraphInputs::alias(const at::Tensor& t) {
  at::Tensor a = owning_alias(t, storages);
  if (record && t.requires_grad()) {
    a.set_requires_grad(true);
    npu_inputs.push_back(t);
    cpu_inputs.push_back(a);
  }
  return a;
}

bool has_no_real_data(const at::Tensor& t) {
  if (!t.defined()) return false;
  const auto ks = t.key_set();
  if (ks.has(c10::DispatchKey::Python) || ks.has(c10::DispatchKey::Functionalize)) return true;
  if (!t.has_storage()) return true;
  return t.unsafeGetTensorImpl()->unsafe_storage().device_type() != c10::DeviceType::PrivateUse1 &&
         t.device().type() == c10::DeviceType::PrivateUse1;
}

CpuGraphBackward::CpuGraphBackward(std::string name, int device, torch::autograd::variable_list cpu_inputs,
                                   torch::autograd::variable_list cpu_outputs, std::string what)
    : name_(std::move(name)),
      device_(device),
      cpu_inputs_(std::move(cpu_inputs)),
      cpu_outputs_(std::move(cpu_outputs)),
      what_(std::move(what)) {}

torch::autograd::variable_list CpuGraphBackward::apply(torch::autograd::variable_list&& grads) {
  TORCH_CHECK(!released_, torch::autograd::ERR_BACKWARD_TWICE);
  TORCH_CHECK(!at::GradMode::is_enabled(), name_, ": double backward (create_graph=True) through ", what_,
              " on the NPU is not supported");
  torch::autograd::variable_list outs, gouts;
  for (size_t i = 0; i < grads.size(); ++i) {
    if (!grads[i].defined()) continue;
    outs.push_back(cpu_outputs_[i]);
    gouts.push_back(exec::cpu_alias(grads[i]));
  }
  torch::autograd::variable_list result(cpu_inputs_.size());
  if (outs.empty()) return result;
  torch::autograd::variable_list cpu_grads;
  {
    exec::DeviceMemoryScope memory(device_);
    cpu_grads = torch::autograd::grad(outs, cpu_inputs_, gouts, /*retain_graph=*/true, /*create_graph=*/false,
                                      /*allow_unused=*/true);
  }
  for (size_t i = 0; i < cpu_grads.size(); ++i) result[i] = exec::share_result(cpu_grads[i], device_);
  return result;
}

void CpuGraphBackward::release_variables() {
  cpu_outputs_.clear();
  cpu_inputs_.clear();
  released_ = true;
}

}  // namespace torch_npu::kernels
