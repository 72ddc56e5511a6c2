// PrivateUse1 hooks: what PyTorch asks of an accelerator backend (device
// count and selection, generators, pointer ownership, pinned host memory).
#include <ATen/core/CachingHostAllocator.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <cstdlib>
#include <mutex>
#include <unordered_set>

#include "core/NPUCachingAllocator.h"
#include "core/NPUException.h"
#include "core/NPUGenerator.h"
#include "runtime/AclRuntime.h"

namespace torch_npu {
namespace {

// Page-locked host memory: plain host memory here, tracked so that
// is_pinned() answers as on hardware. It is also PyTorch's host allocator for
// npu (torch.accelerator.empty_host_cache and Graph capture call it); it caches
// nothing, so emptying the cache has nothing to release.
class PinnedHostAllocator final : public at::HostAllocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    void* p = nullptr;
    if (nbytes > 0) {
      TORCH_CHECK_WITH(OutOfMemoryError, posix_memalign(&p, 64, nbytes) == 0 && p != nullptr,
                       "Malloc pin memory failed, host out of memory, Rried to allocate size: ", nbytes);
      std::lock_guard<std::mutex> g(mu());
      ptrs().insert(p);
    }
    return {p, p, &release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
  bool record_event(void* ptr, void* ctx, c10::Stream stream) override {
    return true;  // memory is freed when its last user drops it; work never lags
  }
  void empty_cache() override {}
  at::HostStats get_stats() override {
    at::HostStats stats;
    std::lock_guard<std::mutex> g(mu());
    const auto n = static_cast<int64_t>(ptrs().size());
    stats.active_requests.current = n;
    stats.allocations.current = n;
    return stats;
  }
  void reset_accumulated_stats() override {}
  void reset_peak_stats() override {}

  static bool owns(const void* p) {
    std::lock_guard<std::mutex> g(mu());
    return ptrs().count(const_cast<void*>(p)) > 0;
  }

 private:
  static std::mutex& mu() {
    static std::mutex* m = new std::mutex();
    return *m;
  }
  static std::unordered_set<void*>& ptrs() {
    static auto* s = new std::unordered_set<void*>();
    return *s;
  }
  static void release(void* p) {
    if (p == nullptr) return;
    {
      std::lock_guard<std::mutex> g(mu());
      ptrs().erase(p);
    }
    std::free(p);
  }
};

PinnedHostAllocator g_pinned;

struct NPUHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return deviceCount() > 0; }
  bool hasPrimaryContext(c10::DeviceIndex device_index) const override {
    TORCH_CHECK(acl_emu::is_valid_device(device_index),
                "hasPrimaryContext expects a valid device index, but got device_index=",
                static_cast<int>(device_index), PTA_ERROR(ErrCode::VALUE));
    return true;
  }
  void init() const override {}
  c10::DeviceIndex deviceCount() const override {
    uint32_t n = 0;
    acl_emu::aclrtGetDeviceCount(&n);
    return static_cast<c10::DeviceIndex>(n);
  }
  void setCurrentDevice(c10::DeviceIndex device) const override { NPU_CHECK_ERROR(acl_emu::aclrtSetDevice(device)); }
  c10::DeviceIndex getCurrentDevice() const override {
    return static_cast<c10::DeviceIndex>(acl_emu::current_device_or_default());
  }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    auto old = getCurrentDevice();
    if (device != old) setCurrentDevice(device);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override {
    if (!acl_emu::is_valid_device(device)) return getCurrentDevice();
    return exchangeDevice(device);
  }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex device_index) const override {
    return default_generator(device_index);
  }
  at::Generator getNewGenerator(c10::DeviceIndex device_index) const override {
    return make_generator(device_index);
  }
  at::Device getDeviceFromPtr(void* data) const override {
    int d = allocator::device_of(data);
    TORCH_CHECK(d >= 0, "The pointer is not NPU device memory allocated by torch_npu.", PTA_ERROR(ErrCode::PTR));
    return at::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(d));
  }
  bool isPinnedPtr(const void* data) const override { return PinnedHostAllocator::owns(data); }
  c10::Allocator* getPinnedMemoryAllocator() const override { return &g_pinned; }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    c10::StorageImpl* s = storage.unsafeGetStorageImpl();
    TORCH_CHECK(s->resizable(), "Trying to resize storage that is not resizable");
    int d = s->device().index();
    c10::DataPtr dp = allocator::allocate(newsize, d, c10::Device(c10::DeviceType::PrivateUse1, d));
    size_t keep = std::min(newsize, s->nbytes());
    if (keep > 0 && s->data() != nullptr) std::memcpy(dp.get(), s->data(), keep);
    s->set_data_ptr_noswap(std::move(dp));
    s->set_nbytes(newsize);
  }
};

}  // namespace

void register_hooks() {
  static NPUHooks* hooks = new NPUHooks();
  static bool done = [] {
    at::RegisterPrivateUse1HooksInterface(hooks);
    at::setHostAllocator(c10::DeviceType::PrivateUse1, &g_pinned);
    return true;
  }();
  (void)done;
}

}  // namespace torch_npu
