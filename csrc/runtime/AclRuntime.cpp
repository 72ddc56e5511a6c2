#include "runtime/AclRuntime.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace acl_emu {
namespace {

// Invalid TORCH_NPU_EMU_* values are reported at the first device use
// (torch.npu._lazy_init), not silently replaced.
std::string g_config_error;

void config_error(const std::string& message) {
  if (g_config_error.empty()) g_config_error = message;
}

uint64_t parse_bytes(const char* name, const char* s, uint64_t fallback) {
  if (s == nullptr || *s == '\0') return fallback;
  char* end = nullptr;
  double v = std::strtod(s, &end);
  std::string unit(end == s ? "" : end);
  for (auto& c : unit) c = static_cast<char>(std::toupper(c));
  double mul = 0;
  if (unit.empty() || unit == "B") mul = 1;
  else if (unit == "K" || unit == "KB" || unit == "KIB") mul = 1024.0;
  else if (unit == "M" || unit == "MB" || unit == "MIB") mul = 1024.0 * 1024;
  else if (unit == "G" || unit == "GB" || unit == "GIB") mul = 1024.0 * 1024 * 1024;
  else if (unit == "T" || unit == "TB" || unit == "TIB") mul = 1024.0 * 1024 * 1024 * 1024;
  if (end == s || mul == 0 || !(v * mul >= 1)) {
    config_error(std::string(name) + " must be a size such as 512MiB, 16GiB or a byte count, got '" + s + "'");
    return fallback;
  }
  return static_cast<uint64_t>(v * mul);
}

int parse_count(const char* name, const char* s, int fallback, int max) {
  char* end = nullptr;
  long v = std::strtol(s, &end, 10);
  if (end == s || *end != '\0' || v < 0 || v > max) {
    config_error(std::string(name) + " must be an integer from 0 to " + std::to_string(max) + ", got '" + s + "'");
    return fallback;
  }
  return static_cast<int>(v);
}

// Same rules as torch_npu.npu._parse_visible_devices: only digits and commas
// are read, an empty element stops parsing, ids must ascend, ids past the
// physical count truncate the list.
std::vector<int> parse_visible(int physical) {
  std::vector<int> out;
  const char* var = std::getenv("ASCEND_RT_VISIBLE_DEVICES");
  if (var == nullptr) {
    for (int i = 0; i < physical; ++i) out.push_back(i);
    return out;
  }
  std::string s(var);
  size_t n = 0;
  while (n < s.size() && (std::isdigit(static_cast<unsigned char>(s[n])) || s[n] == ',')) ++n;
  s = s.substr(0, n);
  if (s.empty()) return out;
  size_t pos = 0;
  while (true) {
    size_t comma = s.find(',', pos);
    std::string elem = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    if (elem.empty()) break;
    int x = std::atoi(elem.c_str());
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
  std::vector<std::atomic<int64_t>> streams;
  explicit State(DeviceConfig c)
      : cfg(std::move(c)), used(cfg.visible.size()), streams(cfg.visible.size()) {
    for (auto& u : used) u = 0;
    for (auto& s : streams) s = 1;
  }
};

State& state() {
  static State* s = [] {
    DeviceConfig c;
    if (const char* n = std::getenv("TORCH_NPU_EMU_DEVICE_COUNT")) {
      c.physical_count = parse_count("TORCH_NPU_EMU_DEVICE_COUNT", n, c.physical_count, 64);
    }
    if (const char* n = std::getenv("TORCH_NPU_EMU_DEVICE_NAME")) {
      if (*n) c.name = n;
    }
    c.capacity = parse_bytes("TORCH_NPU_EMU_MEMORY", std::getenv("TORCH_NPU_EMU_MEMORY"), c.capacity);
    c.visible = parse_visible(c.physical_count);
    return new State(std::move(c));  // leaked: must outlive static tensors
  }();
  return *s;
}

thread_local int32_t tls_device = -1;

}  // namespace

const DeviceConfig& config() { return state().cfg; }

const std::string& config_error() {
  state();
  return g_config_error;
}

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

int64_t stream_create(int32_t device, int /*priority*/) {
  return state().streams[device]++;
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
