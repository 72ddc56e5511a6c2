// Serialization of the private format tag: torch.save records it in the
// tensor's metadata ("npu_format_<N>": true) and torch.load restores it, as
// the real torch_npu keeps a tensor's format across a checkpoint.
#include <torch/csrc/jit/serialization/pickler_helper.h>

#include <string>

#include "core/NPUCachingAllocator.h"

namespace torch_npu::format {
namespace {

constexpr const char* kPrefix = "npu_format_";

void save_format(const at::Tensor& t, std::unordered_map<std::string, bool>& meta) {
  const void* data = t.unsafeGetTensorImpl()->unsafe_storage().data();
  const int fmt = data ? allocator::storage_format(data) : -1;
  if (fmt >= 0) meta[std::string(kPrefix) + std::to_string(fmt)] = true;
}

void load_format(const at::Tensor& t, std::unordered_map<std::string, bool>& meta) {
  for (auto it = meta.begin(); it != meta.end(); ++it) {
    if (it->first.rfind(kPrefix, 0) != 0) continue;
    const int fmt = std::stoi(it->first.substr(std::char_traits<char>::length(kPrefix)));
    const void* data = t.unsafeGetTensorImpl()->unsafe_storage().data();
    if (data) allocator::set_storage_format(data, fmt);
    meta.erase(it);
    return;
  }
}

}  // namespace

void register_serialization() {
  torch::jit::TensorBackendMetaRegistry(c10::DeviceType::PrivateUse1, &save_format, &load_format);
}

}  // namespace torch_npu::format
