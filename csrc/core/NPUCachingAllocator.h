// Per-device caching allocator for emulated NPU memory, shaped like CUDA's:
// blocks carved from segments obtained through aclrtMalloc, a small pool
// (<= 1 MiB requests, 2 MiB segments) and a large pool, block splitting and
// coalescing, CUDA's statistics keys, PYTORCH_NPU_ALLOC_CONF, and the real
// torch_npu out-of-memory text.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Stream.h>

#include <cstdint>
#include <string>
#include <vector>

namespace torch_npu::allocator {

// CUDA's statistics structure, shared with torch.accelerator's memory API.
using DeviceStats = c10::CachingDeviceAllocator::DeviceStats;
using Stat = c10::CachingAllocator::Stat;
using StatArray = c10::CachingAllocator::StatArray;
enum StatIndex { ALL = 0, SMALL_POOL = 1, LARGE_POOL = 2, NUM_STAT_TYPES = 3 };

struct BlockInfo {
  int64_t address, size, requested_size;
  bool allocated;
  bool pending = false;  // freed, waiting for streams added by record_stream
};
struct SegmentInfo {
  int device;
  int64_t address, total_size, allocated_size, active_size, requested_size;
  int64_t stream;
  bool is_large;
  std::vector<BlockInfo> blocks;
};

// The allocator registered for PrivateUse1 (a c10 DeviceAllocator, so that
// torch.accelerator's memory API works): allocates on the current device.
c10::Allocator* get();
// An allocator bound to one device (valid index required).
c10::Allocator* get(int device);

// Allocation on an explicit device; returns a DataPtr labelled `label`
// (npu:device for device tensors, cpu while a CPU kernel runs on an alias).
c10::DataPtr allocate(size_t nbytes, int device, c10::Device label);
// Deleter shared by every DataPtr we hand out (context == data pointer).
void free_ptr(void* ptr);
c10::DeleterFnPtr deleter();
// Device owning `ptr` if it is an allocation of ours, else -1.
int device_of(const void* ptr);
// Stream the block starting at `ptr` was allocated on, while it is in use, else -1.
int64_t stream_of(const void* ptr);
// torch_npu's private format tag of the allocation starting at `ptr`: it
// lives with the memory, so every view of a storage sees it. -1 = not set
// (the base format); a fresh or reused block starts unset.
int storage_format(const void* ptr);
bool set_storage_format(const void* ptr, int format);

// Shared device memory for torch.multiprocessing (the emulator's IPC
// memory). It lives outside the pools: other processes may still map it
// after this one frees it, so it is never reused. The exporting process
// counts it as one segment and one allocation of the large pool in its
// statistics (memory_allocated / memory_reserved); a process that imports
// it counts nothing, as a CUDA process does for memory opened by IPC handle.
c10::DataPtr allocate_shared(size_t nbytes, int device);
// Maps a handle exported by another process; takes ownership of `handle`.
c10::DataPtr import_shared(int handle, size_t nbytes, int device);
// The handle (a file descriptor owned by the DataPtr) of a shared
// allocation, or -1 when `data` is not one.
int shared_handle(const c10::DataPtr& data);

// Stream-ordered reuse, as CUDA's: a block is allocated on the device's
// current stream and, once freed, reused only by allocations on that stream.
// record_stream(data, s) marks a pool block as used on `s` too: when freed it
// waits (active, out of the pools) until `s` has progressed past the free, see
// Allocator::process_pending. erase_stream drops such a mark. Both ignore
// memory that is not a pool block, and report to the trace hooks.
void record_stream(const c10::DataPtr& data, const c10::Stream& stream);
void erase_stream(const c10::DataPtr& data, const c10::Stream& stream);

void* raw_alloc(size_t nbytes, int device);
void raw_delete(void* ptr);

void empty_cache();
DeviceStats stats(int device);
void reset_accumulated_stats(int device);
void reset_peak_stats(int device);
std::vector<SegmentInfo> snapshot();
void set_memory_fraction(double fraction, int device);
double get_memory_fraction(int device);
// (free, total) as the driver sees it.
std::pair<uint64_t, uint64_t> mem_get_info(int device);
// Creates the allocator, which parses PYTORCH_NPU_ALLOC_CONF (raises on a bad key).
void init();
// Parsed PYTORCH_NPU_ALLOC_CONF as "key:value" pairs (for diagnostics).
std::string config_string();

}  // namespace torch_npu::allocator
