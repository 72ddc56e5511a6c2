// Emulated AscendCL runtime ("acl" layer). The CPU is the compute engine; this
// layer only models what CANN's runtime owns: devices, device memory
// capacity, streams and events. Everything above it (allocator, guard,
// hooks, op execution) talks to the device through these calls, just as
// torch_npu talks to libascendcl.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace acl_emu {

// AscendCL-style status codes (subset).
using aclError = int;
constexpr aclError ACL_SUCCESS = 0;
constexpr aclError ACL_ERROR_RT_INVALID_DEVICEID = 107001;
constexpr aclError ACL_ERROR_RT_MEMORY_ALLOCATION = 207001;

struct DeviceConfig {
  int physical_count = 8;          // TORCH_NPU_EMU_DEVICE_COUNT
  std::string name = "Ascend910B4"; // TORCH_NPU_EMU_DEVICE_NAME
  uint64_t capacity = 64ULL << 30;  // TORCH_NPU_EMU_MEMORY (bytes per device)
  std::vector<int> visible;         // logical id -> physical id
};

// Built once, at the first use, from torch_npu's settings (core/Settings.h).
const DeviceConfig& config();

// Number of devices visible to this process (after ASCEND_RT_VISIBLE_DEVICES).
int aclrtGetDeviceCount(uint32_t* count);
aclError aclrtSetDevice(int32_t device);
aclError aclrtGetDevice(int32_t* device);
// The device this thread currently has set, without validation (-1 = none).
int32_t current_device_or_default();
bool is_valid_device(int64_t device);
// ACL_SUCCESS or ACL_ERROR_RT_INVALID_DEVICEID, without side effects.
aclError aclrtCheckDevice(int32_t device);

// Device memory: host pages stand in for HBM. Capacity is enforced by the
// caller (the caching allocator) so that its OOM text matches torch_npu's.
aclError aclrtMalloc(void** ptr, size_t size, int32_t device);
aclError aclrtFree(void* ptr, size_t size, int32_t device);
// Bytes currently obtained from the "driver" on a device (all processes in
// the emulator are independent, so this is also what the driver sees).
uint64_t driver_used_bytes(int32_t device);

// Shareable device memory, the emulator's IPC memory: a memory file mapped
// MAP_SHARED, so every process that maps its handle (a file descriptor)
// sees the same bytes. Counted in driver_used_bytes of the process that
// allocated it; mapping an imported handle counts nothing.
aclError aclrtMallocShareable(void** ptr, size_t size, int32_t device, int* handle);
aclError aclrtFreeShareable(void* ptr, size_t size, int32_t device, int handle);
aclError aclrtMapShareable(int handle, size_t size, void** ptr);
aclError aclrtUnmapShareable(void* ptr, size_t size, int handle);

// Streams: 0 is the default stream of every device (CUDA's null stream);
// created streams get ids unique in the process, whatever their device, so
// an id alone names a stream (the trace hooks and the sanitizer key on it).
// Execution is synchronous, so a stream only carries identity and ordering
// bookkeeping.
int64_t stream_create(int32_t device, int priority);

// What the host has observed of a stream's progress, for the allocator's
// stream-ordered reuse. Every note advances one process-wide tick; a stream's
// progress is the tick of the last event recorded on it or of its last
// synchronisation (stream or whole device), whichever is later.
uint64_t progress_tick();
uint64_t stream_progress(int32_t device, int64_t stream);
void note_stream_progress(int32_t device, int64_t stream);
void note_device_synchronized(int32_t device);

// Events record a host timestamp (microseconds) when recorded on a stream.
double now_us();

// Human readable "error code is N" expansion like CANN's error manager.
std::string error_text(aclError err);

}  // namespace acl_emu
