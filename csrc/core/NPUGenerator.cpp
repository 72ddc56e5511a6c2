#include "core/NPUGenerator.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <ATen/Utils.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <cstring>
#include <deque>
#include <mutex>
#include <vector>

#include "core/NPUException.h"
#include "runtime/AclRuntime.h"

namespace torch_npu {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

}  // namespace

NPUGeneratorImpl::NPUGeneratorImpl(c10::DeviceIndex device, uint64_t seed)
    : c10::GeneratorImpl(c10::Device(c10::DeviceType::PrivateUse1, device),
                         c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
      seed_(seed) {}

void NPUGeneratorImpl::set_current_seed(uint64_t seed) {
  seed_ = seed;
  offset_ = 0;
}
uint64_t NPUGeneratorImpl::current_seed() const { return seed_; }
uint64_t NPUGeneratorImpl::seed() {
  auto s = c10::detail::getNonDeterministicRandom(true);
  set_current_seed(s);
  return s;
}
void NPUGeneratorImpl::set_offset(uint64_t offset) { offset_ = offset; }
uint64_t NPUGeneratorImpl::get_offset() const { return offset_; }

void NPUGeneratorImpl::set_state(const c10::TensorImpl& new_state) {
  TORCH_CHECK(new_state.dtype() == caffe2::TypeMeta::Make<uint8_t>(),
              "RNG state must be a torch.ByteTensor", PTA_ERROR(ErrCode::TYPE));
  auto n = new_state.numel();
  TORCH_CHECK(n == 16 || n == 8, "RNG state is wrong size", PTA_ERROR(ErrCode::PARAM));
  const auto* bytes = static_cast<const uint8_t*>(new_state.data());
  uint64_t seed = 0;
  int64_t offset = 0;
  std::memcpy(&seed, bytes, 8);
  if (n == 16) std::memcpy(&offset, bytes + 8, 8);
  seed_ = seed;
  offset_ = static_cast<uint64_t>(offset);
}

c10::intrusive_ptr<c10::TensorImpl> NPUGeneratorImpl::get_state() const {
  auto state = c10::make_intrusive<c10::TensorImpl>(
      c10::Storage(c10::Storage::use_byte_size_t(), 16, c10::GetCPUAllocator(), true),
      c10::DispatchKeySet(c10::DispatchKey::CPU), caffe2::TypeMeta::Make<uint8_t>());
  state->set_sizes_contiguous({16});
  auto* bytes = static_cast<uint8_t*>(state->mutable_data());
  int64_t offset = static_cast<int64_t>(offset_);
  std::memcpy(bytes, &seed_, 8);
  std::memcpy(bytes + 8, &offset, 8);
  return state;
}

at::Generator NPUGeneratorImpl::engine_for_op(int64_t numel) {
  uint64_t s, o;
  {
    std::lock_guard<std::mutex> g(mutex_);
    s = seed_;
    o = offset_;
    // Advance like Philox: 4 values per counter step, at least one step.
    uint64_t steps = numel > 0 ? (static_cast<uint64_t>(numel) + 3) / 4 : 1;
    offset_ += 4 * steps;
  }
  return at::make_generator<at::CPUGeneratorImpl>(splitmix64(s ^ splitmix64(o)));
}

NPUGeneratorImpl* NPUGeneratorImpl::clone_impl() const {
  auto* g = new NPUGeneratorImpl(device().index(), seed_);
  g->offset_ = offset_;
  return g;
}

const at::Generator& default_generator(c10::DeviceIndex device) {
  static std::once_flag once;
  static std::vector<at::Generator>* gens = nullptr;
  std::call_once(once, [] {
    uint32_t n = 0;
    acl_emu::aclrtGetDeviceCount(&n);
    gens = new std::vector<at::Generator>();
    for (uint32_t i = 0; i < n; ++i) {
      gens->push_back(at::make_generator<NPUGeneratorImpl>(static_cast<c10::DeviceIndex>(i)));
    }
  });
  if (device == -1) device = static_cast<c10::DeviceIndex>(acl_emu::current_device_or_default());
  TORCH_CHECK(device >= 0 && device < static_cast<c10::DeviceIndex>(gens->size()), "Invalid device_index : ",
              static_cast<int>(device), PTA_ERROR(ErrCode::VALUE));
  return (*gens)[device];
}

at::Generator make_generator(c10::DeviceIndex device) {
  if (device == -1) device = static_cast<c10::DeviceIndex>(acl_emu::current_device_or_default());
  TORCH_CHECK(acl_emu::is_valid_device(device), "Invalid device_index : ", static_cast<int>(device),
              PTA_ERROR(ErrCode::VALUE));
  return at::make_generator<NPUGeneratorImpl>(device);
}

}  // namespace torch_npu
