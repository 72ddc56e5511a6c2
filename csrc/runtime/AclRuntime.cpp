#include "runtime/AclRuntime.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <algorithm>

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/Settings.h"

namespace acl_emu {
namespace {
namespace settings = torch_npu::settings;

// The configuration comes from torch_npu._settings (csrc/core/Settings.h):
// values are validated there and arrive canonical (device count 0..64, size in
// bytes, visible ids that fit an int). An invalid value never arrives, so the
// default stands until Python raises its error at the first device use.

// Same rules as torch_npu._settings' ASCEND_RT_VISIBLE_DEVICES grammar (which
// already stopped at the first non-id character or empty element): ids must
// ascend, ids past the physical count truncate the list.
std::vector<int> visible_devices(int physical) {
  std::vector<int> out;
  auto var = settings::get("ASCEND_RT_VISIBLE_DEVICES");
  if (!var) {
    for (int i = 0; i < physical; ++i) out.push_back(i);
    return out;
  }
  const std::string& s = *var;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t comma = s.find(',', pos);
    int x = std::stoi(s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos));
    if (!out.empty() && x <= out.back()) return {};
    if (x >= physical) break;
    out.push_back(x);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

struct State {
  DeviceConfig cfg;
  std::vector<std::atomic<uint64_t>> used;
  std::atomic<int64_t> next_stream{1};
  // Stream progress (see stream_progress): ticks under `progress_mu`.
  std::mutex progress_mu;
  std::atomic<uint64_t> tick{0};
  std::unordered_map<int64_t, uint64_t> stream_seen;  // key: stream id (+ device for the default stream)
  std::vector<uint64_t> device_synced;
  explicit State(DeviceConfig c)
      : cfg(std::move(c)), used(cfg.visible.size()), device_synced(cfg.visible.size(), 0) {
    for (auto& u : used) u = 0;
  }
};

State& state() {
  static State* s = [] {
    DeviceConfig c;
    if (auto n = settings::get("TORCH_NPU_EMU_DEVICE_COUNT")) c.physical_count = std::stoi(*n);
    if (auto n = settings::get("TORCH_NPU_EMU_DEVICE_NAME")) c.name = *n;
    if (auto n = settings::get("TORCH_NPU_EMU_MEMORY")) c.capacity = std::stoull(*n);
    c.visible = visible_devices(c.physical_count);
    return new State(std::move(c));  // leaked: must outlive static tensors
  }();
  return *s;
}

thread_local int32_t tls_device = -1;

}  // namespace

const DeviceConfig& config() { return state().cfg; }

int aclrtGetDeviceCount(uint32_t* count) {
  *count = static_cast<uint32_t>(state().cfg.visible.size());
  return ACL_SUCCESS;
}

bool is_valid_device(int64_t device) {
  return device >= 0 && device < static_cast<int64_t>(state().cfg.visible.size());
}

aclError aclrtCheckDevice(int32_t device) {
  return is_valid_device(device) ? ACL_SUCCESS : ACL_ERROR_RT_INVALID_DEVICEID;
}

aclError aclrtSetDevice(int32_t device) {
  if (!is_valid_device(device)) return ACL_ERROR_RT_INVALID_DEVICEID;
  tls_device = device;
  return ACL_SUCCESS;
}

aclError aclrtGetDevice(int32_t* device) {
  *device = tls_device < 0 ? 0 : tls_device;
  return ACL_SUCCESS;
}

int32_t current_device_or_default() { return tls_device < 0 ? 0 : tls_device; }

aclError aclrtMalloc(void** ptr, size_t size, int32_t device) {
  if (!is_valid_device(device)) return ACL_ERROR_RT_INVALID_DEVICEID;
  // 64-byte alignment like c10's CPU allocator so vectorised CPU kernels
  // see the same alignment on device memory as on host memory.
  void* p = nullptr;
  if (posix_memalign(&p, 64, size == 0 ? 64 : size) != 0 || p == nullptr) {
    *ptr = nullptr;
    return ACL_ERROR_RT_MEMORY_ALLOCATION;
  }
  state().used[device] += size;
  *ptr = p;
  return ACL_SUCCESS;
}

aclError aclrtFree(void* ptr, size_t size, int32_t device) {
  if (!is_valid_device(device)) return ACL_ERROR_RT_INVALID_DEVICEID;
  std::free(ptr);
  state().used[device] -= size;
  return ACL_SUCCESS;
}

uint64_t driver_used_bytes(int32_t device) {
  return is_valid_device(device) ? state().used[device].load() : 0;
}

namespace {
size_t mapped_size(size_t size) { return size == 0 ? 1 : size; }
}  // namespace

aclError aclrtMallocShareable(void** ptr, size_t size, int32_t device, int* handle) {
  *ptr = nullptr;
  *handle = -1;
  if (!is_valid_device(device)) return ACL_ERROR_RT_INVALID_DEVICEID;
  int fd = static_cast<int>(syscall(SYS_memfd_create, "torch_npu_ipc", 1U /* MFD_CLOEXEC */));
  if (fd < 0) return ACL_ERROR_RT_MEMORY_ALLOCATION;
  if (ftruncate(fd, static_cast<off_t>(mapped_size(size))) != 0) {
    close(fd);
    return ACL_ERROR_RT_MEMORY_ALLOCATION;
  }
  void* p = mmap(nullptr, mapped_size(size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    close(fd);
    return ACL_ERROR_RT_MEMORY_ALLOCATION;
  }
  state().used[device] += size;
  *ptr = p;
  *handle = fd;
  return ACL_SUCCESS;
}

aclError aclrtFreeShareable(void* ptr, size_t size, int32_t device, int handle) {
  if (!is_valid_device(device)) return ACL_ERROR_RT_INVALID_DEVICEID;
  munmap(ptr, mapped_size(size));
  close(handle);
  state().used[device] -= size;
  return ACL_SUCCESS;
}

aclError aclrtMapShareable(int handle, size_t size, void** ptr) {
  void* p = mmap(nullptr, mapped_size(size), PROT_READ | PROT_WRITE, MAP_SHARED, handle, 0);
  if (p == MAP_FAILED) {
    *ptr = nullptr;
    return ACL_ERROR_RT_MEMORY_ALLOCATION;
  }
  *ptr = p;
  return ACL_SUCCESS;
}

aclError aclrtUnmapShareable(void* ptr, size_t size, int handle) {
  munmap(ptr, mapped_size(size));
  close(handle);
  return ACL_SUCCESS;
}

int64_t stream_create(int32_t /*device*/, int /*priority*/) {
  return state().next_stream++;
}

namespace {
// Created streams have unique ids; default streams (0) are told apart by device.
int64_t progress_key(int32_t device, int64_t stream) { return stream == 0 ? -1 - device : stream; }
}  // namespace

uint64_t progress_tick() { return state().tick.load(); }

uint64_t stream_progress(int32_t device, int64_t stream) {
  State& st = state();
  std::lock_guard<std::mutex> g(st.progress_mu);
  uint64_t dev = is_valid_device(device) ? st.device_synced[device] : 0;
  auto it = st.stream_seen.find(progress_key(device, stream));
  return std::max(dev, it == st.stream_seen.end() ? 0 : it->second);
}

void note_stream_progress(int32_t device, int64_t stream) {
  State& st = state();
  std::lock_guard<std::mutex> g(st.progress_mu);
  st.stream_seen[progress_key(device, stream)] = ++st.tick;
}

void note_device_synchronized(int32_t device) {
  if (!is_valid_device(device)) return;
  State& st = state();
  std::lock_guard<std::mutex> g(st.progress_mu);
  st.device_synced[device] = ++st.tick;
}


double now_us() {
  using namespace std::chrono;
  return duration<double, std::micro>(steady_clock::now().time_since_epoch()).count();
}

std::string error_text(aclError err) {
  switch (err) {
    case ACL_ERROR_RT_INVALID_DEVICEID:
      return "\n[Error]: Invalid device ID.\n        Check whether the device ID is valid.";
    case ACL_ERROR_RT_MEMORY_ALLOCATION:
      return "\n[Error]: Failed to allocate memory.";
    default:
      return "";
  }
}

}  // namespace acl_emu
