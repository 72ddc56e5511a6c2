#include "core/NPUCachingAllocator.h"

#include "core/EmuLog.h"

#include <c10/util/Exception.h>

#include <array>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <sstream>
#include <new>
#include <optional>

#include "core/NPUException.h"
#include "core/NPUGuard.h"
#include "core/NPUTrace.h"
#include "core/Settings.h"
#include "runtime/AclRuntime.h"

namespace torch_npu::allocator {
namespace {

constexpr size_t kMinBlockSize = 512;
constexpr size_t kBlockPad = 32;
constexpr size_t kSmallSize = 1048576;       // <= 1 MiB goes to the small pool
constexpr size_t kSmallBuffer = 2097152;     // small-pool segment size
constexpr size_t kLargeBuffer = 20971520;    // segment for 1-10 MiB requests
constexpr size_t kMinLargeAlloc = 10485760;
constexpr size_t kRoundLarge = 2097152;
constexpr uint64_t kOneEB = 1ULL << 60;

std::string format_size(uint64_t size) {
  std::ostringstream os;
  os.precision(2);
  os << std::fixed;
  if (size <= 1024) {
    os << size << " bytes";
  } else if (size <= 1048576) {
    os << (size / 1024.0) << " KiB";
  } else if (size <= 1073741824ULL) {
    os << (size / 1048576.0) << " MiB";
  } else {
    os << (size / 1073741824.0) << " GiB";
  }
  return os.str();
}

// ---- PYTORCH_NPU_ALLOC_CONF ------------------------------------------------
struct AllocConf {
  size_t max_split_size = SIZE_MAX;
  double gc_threshold = 0.0;
  bool expandable_segments = false;
  double conf_fraction = 0.0;  // per_process_memory_fraction from the env
  bool caching_disabled = false;
  std::string text;
};

[[noreturn]] void bad_conf(const std::string& msg) {
  TORCH_CHECK(false, msg, PTA_ERROR(ErrCode::PARAM));
}

AllocConf parse_conf() {
  AllocConf c;
  // Values from torch_npu._settings (core/Settings.h); the grammar is parsed here.
  const auto npu = settings::get("PYTORCH_NPU_ALLOC_CONF");
  const auto generic = settings::get("PYTORCH_ALLOC_CONF");
  if (npu && generic) {
    bad_conf("PYTORCH_NPU_ALLOC_CONF and PYTORCH_ALLOC_CONF cannot be set at the same time.");
  }
  c.caching_disabled = settings::flag("PYTORCH_NO_NPU_MEMORY_CACHING", false);
  if (!npu && !generic) return c;
  c.text = npu ? *npu : *generic;
  const std::string& env = c.text;
  std::string s(env);
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t comma = s.find(',', pos);
    std::string item = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    pos = comma == std::string::npos ? s.size() + 1 : comma + 1;
    // strip spaces
    item.erase(std::remove(item.begin(), item.end(), ' '), item.end());
    if (item.empty()) continue;
    size_t colon = item.find(':');
    if (colon == std::string::npos) {
      bad_conf("Error parsing backend configuration, expected ':' after key in \"" + item + "\"");
    }
    std::string key = item.substr(0, colon), val = item.substr(colon + 1);
    auto as_double = [&](double lo, double hi, bool lo_open, bool hi_open) {
      char* end = nullptr;
      double v = std::strtod(val.c_str(), &end);
      bool ok = end && *end == '\0' && !val.empty() && (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
      if (!ok) bad_conf(key + " is invalid, got " + val);
      return v;
    };
    if (key == "max_split_size_mb") {
      double v = as_double(kLargeBuffer / 1048576.0, 1e18, true, false);
      c.max_split_size = static_cast<size_t>(v) * 1048576;
    } else if (key == "garbage_collection_threshold") {
      c.gc_threshold = as_double(0.0, 1.0, true, true);
    } else if (key == "expandable_segments") {
      if (val != "True" && val != "False") bad_conf("Expected a single True/False argument for expandable_segments");
      c.expandable_segments = val == "True";
    } else if (key == "per_process_memory_fraction") {
      c.conf_fraction = as_double(0.0, 1.0, false, false);
    } else if (key == "base_addr_aligned_kb" || key == "segment_size_mb" || key == "large_segment_size_mb" ||
               key == "roundup_power2_divisions" || key == "page_size" || key == "pinned_use_background_threads" ||
               key == "pin_memory_expandable_segments" || key == "pinned_mem_register" ||
               key == "release_lock_on_npumalloc") {
      // Accepted for compatibility; these tune hardware paging and have no
      // observable effect on an emulated device.
    } else {
      bad_conf("Unrecognized CachingAllocator option: " + key);
    }
  }
  return c;
}

// Fixed-size free lists. Every user holds the allocator mutex, so they need
// no lock of their own; the memory they keep is bounded by the peak number
// of live objects and is never returned (the allocator is never destroyed).
// They spare the malloc/free that each split, merge and pool insert/erase
// would otherwise cost.
template <size_t Size>
struct FreeList {
  struct Node {
    Node* next;
  };
  static_assert(Size >= sizeof(Node), "free-list objects hold the link");
  static inline Node* head = nullptr;
  static void* get() {
    if (head == nullptr) return ::operator new(Size);
    Node* n = head;
    head = n->next;
    return n;
  }
  static void put(void* p) {
    Node* n = static_cast<Node*>(p);
    n->next = head;
    head = n;
  }
};

// std::allocator for the pools' tree nodes, drawing single nodes from a FreeList.
template <typename T>
struct NodeAlloc {
  using value_type = T;
  NodeAlloc() = default;
  template <typename U>
  NodeAlloc(const NodeAlloc<U>&) {}
  T* allocate(size_t n) {
    if (n == 1) return static_cast<T*>(FreeList<sizeof(T)>::get());
    return static_cast<T*>(::operator new(n * sizeof(T)));
  }
  void deallocate(T* p, size_t n) {
    if (n == 1) {
      FreeList<sizeof(T)>::put(p);
    } else {
      ::operator delete(p);
    }
  }
  template <typename U>
  bool operator==(const NodeAlloc<U>&) const { return true; }
  template <typename U>
  bool operator!=(const NodeAlloc<U>&) const { return false; }
};

// ---- blocks ----------------------------------------------------------------
struct Block;

// Pools are ordered by stream first, as CUDA's: a lookup only ever sees the
// blocks of the requesting stream. Each entry holds a copy of its block's
// key, so a search reads tree nodes only (no Block per level), and a best-fit
// lookup compares against a bare PoolKey.
struct PoolKey {
  int64_t stream;
  size_t size;
  const char* ptr;
};
struct PoolEntry : PoolKey {
  Block* block;
};

struct BlockLess {
  using is_transparent = void;
  bool operator()(const PoolKey& a, const PoolKey& b) const {
    if (a.stream != b.stream) return a.stream < b.stream;
    if (a.size != b.size) return a.size < b.size;
    return a.ptr < b.ptr;
  }
};
using Pool = std::set<PoolEntry, BlockLess, NodeAlloc<PoolEntry>>;

struct Block {
  int device;
  size_t size;
  size_t requested = 0;
  char* ptr;
  int64_t stream = 0;  // the stream it was allocated on; its segment belongs to that stream
  bool allocated = false;
  bool small;
  // Streams added by record_stream (never the allocation stream). A freed
  // block with any waits in `pending` until they have all progressed.
  std::vector<int64_t> stream_uses;
  bool pending = false;
  uint64_t freed_tick = 0;
  int32_t format = -1;  // torch_npu private format of the storage (-1: the base format)
  Block* prev = nullptr;
  Block* next = nullptr;
  Pool::iterator pool_pos;  // where it sits in its pool while is_free()
  Block(int d, size_t s, char* p, bool sm, int64_t st) : device(d), size(s), ptr(p), stream(st), small(sm) {}
  // Blocks live in a FreeList (under the allocator mutex): split and merge
  // create and destroy one per allocation in steady state.
  static Block* make(int d, size_t s, char* p, bool sm, int64_t st) {
    return new (FreeList<sizeof(Block)>::get()) Block(d, s, p, sm, st);
  }
  static void destroy(Block* b) {
    b->~Block();
    FreeList<sizeof(Block)>::put(b);
  }
  bool is_split() const { return prev != nullptr || next != nullptr; }
  // Free and in a pool (neither in use nor waiting for recorded streams).
  bool is_free() const { return !allocated && !pending; }
};

// The blocks in use, by address: open addressing with linear probing and
// backward-shift deletion (no tombstones), at most half full. Lookups by
// address happen on every free, so this replaces a node-based hash map.
class ActiveMap {
 public:
  Block* find(const void* key) const {
    if (slots_.empty()) return nullptr;
    for (size_t i = home(key);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == key) return s.block;
      if (s.key == nullptr) return nullptr;
    }
  }
  // Inserts or replaces the entry of `key` (non-null).
  void put(const void* key, Block* block) {
    if ((count_ + 1) * 2 > slots_.size()) grow();
    size_t i = home(key);
    while (slots_[i].key != nullptr && slots_[i].key != key) i = (i + 1) & mask_;
    if (slots_[i].key == nullptr) ++count_;
    slots_[i] = {key, block};
  }
  // Removes the entry of `key`; returns its block, or nullptr if absent.
  Block* take(const void* key) {
    if (slots_.empty() || key == nullptr) return nullptr;
    size_t i = home(key);
    while (slots_[i].key != key) {
      if (slots_[i].key == nullptr) return nullptr;
      i = (i + 1) & mask_;
    }
    Block* found = slots_[i].block;
    // Shift later members of the probe run back over the hole, keeping every
    // entry reachable from its home slot.
    for (size_t j = (i + 1) & mask_; slots_[j].key != nullptr; j = (j + 1) & mask_) {
      const size_t h = home(slots_[j].key);
      const bool stays = i <= j ? (i < h && h <= j) : (i < h || h <= j);
      if (!stays) {
        slots_[i] = slots_[j];
        i = j;
      }
    }
    slots_[i] = {nullptr, nullptr};
    --count_;
    return found;
  }

 private:
  struct Slot {
    const void* key;
    Block* block;
  };
  size_t home(const void* key) const {
    // Fibonacci hashing of the address (blocks are 512-byte aligned in their segment).
    const uint64_t x = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(key)) * 0x9E3779B97F4A7C15ULL;
    return static_cast<size_t>(x >> shift_);
  }
  void grow() {
    std::vector<Slot> old;
    old.swap(slots_);
    const size_t n = old.empty() ? 1024 : old.size() * 2;
    slots_.assign(n, Slot{nullptr, nullptr});
    mask_ = n - 1;
    shift_ = 64 - __builtin_ctzll(n);
    count_ = 0;
    for (const Slot& s : old) {
      if (s.key != nullptr) put(s.key, s.block);
    }
  }
  std::vector<Slot> slots_;
  size_t mask_ = 0;
  int shift_ = 64;
  size_t count_ = 0;
};

struct DeviceState {
  Pool small_free, large_free;
  std::vector<Block*> pending;  // freed blocks waiting for their recorded streams
  std::set<Block*, std::less<Block*>, NodeAlloc<Block*>> segments;  // first block of each segment
  DeviceStats stats;
  uint64_t reserved = 0;
  double fraction = 1.0;
};

std::array<StatArray*, 9> stat_arrays(DeviceStats& s) {
  return {&s.allocation, &s.segment, &s.active, &s.inactive_split, &s.allocated_bytes,
          &s.reserved_bytes, &s.active_bytes, &s.inactive_split_bytes, &s.requested_bytes};
}

class Allocator {
 public:
  Allocator() : conf_(parse_conf()) {
    uint32_t n = 0;
    acl_emu::aclrtGetDeviceCount(&n);
    devices_.resize(n);
    for (auto& d : devices_) {
      d.stats.max_split_size = conf_.max_split_size == SIZE_MAX ? 0 : static_cast<int64_t>(conf_.max_split_size);
      if (conf_.conf_fraction > 0) d.fraction = conf_.conf_fraction;
    }
  }

  // Allocates on the device's current stream.
  void* malloc(size_t size, int device) {
    std::optional<log::Deferred> logs;  // emitted after the lock is released (the Python sink takes the GIL)
    std::lock_guard<std::mutex> g(mu_);
    LogBinding bind(this, &logs);
    check_device(device);
    const int64_t stream = current_stream_id(device);
    DeviceState& ds = devices_[device];
    if (!ds.pending.empty()) process_pending(ds);
    if (size >= kOneEB) {
      ds.stats.num_ooms++;
      TORCH_CHECK_WITH(OutOfMemoryError, false, "NPU out of memory. Tried to allocate more than 1EB memory.");
    }
    size_t rounded = round_size(size);
    bool small = rounded <= kSmallSize;
    auto& pool = small ? ds.small_free : ds.large_free;
    Block* b = find_free(pool, rounded, stream);
    const bool pooled = b != nullptr;
    if (!pooled) {
      maybe_collect(ds);
      b = new_segment(ds, device, rounded, small, size, stream);
    }
    b = take(ds, pool, b, pooled, rounded);
    b->allocated = true;
    b->requested = size;
    b->format = -1;
    active_.put(b->ptr, b);
    update_alloc_stats(ds, b, +1);
    update_active_stats(ds, b, +1);
    report_to_profiler(ds, b, device, static_cast<int64_t>(b->size));
    return b->ptr;
  }

  void free(void* ptr) {
    std::optional<log::Deferred> logs;  // emitted after the lock is released (the Python sink takes the GIL)
    std::lock_guard<std::mutex> g(mu_);
    LogBinding bind(this, &logs);
    Block* b = active_.take(ptr);
    TORCH_INTERNAL_ASSERT(b != nullptr, "invalid device pointer freed: ", ptr);
    DeviceState& ds = devices_[b->device];
    update_alloc_stats(ds, b, -1);
    report_to_profiler(ds, b, b->device, -static_cast<int64_t>(b->size));
    b->allocated = false;
    if (!b->stream_uses.empty()) {
      // CUDA records an event on each recorded stream and returns the block
      // once they complete; here: once each stream has progressed (see
      // process_pending). It stays active until then.
      b->pending = true;
      b->freed_tick = acl_emu::progress_tick();
      ds.pending.push_back(b);
      return;
    }
    return_to_pool(ds, b);
  }

  // Tensor.record_stream: the block may not be reused by its allocation
  // stream before `stream` has progressed past the block's free.
  void record_stream(void* ptr, const c10::Stream& stream) {
    std::lock_guard<std::mutex> g(mu_);
    Block* b = active_.find(ptr);
    if (b == nullptr) return;  // not a pool block (e.g. shared memory): nothing to delay
    const int64_t id = stream.id();
    if (id == b->stream) return;
    if (std::find(b->stream_uses.begin(), b->stream_uses.end(), id) == b->stream_uses.end()) {
      b->stream_uses.push_back(id);
    }
  }

  // torch_npu.erase_stream: forget a record_stream mark.
  void erase_stream(void* ptr, const c10::Stream& stream) {
    std::lock_guard<std::mutex> g(mu_);
    Block* b = active_.find(ptr);
    if (b == nullptr) return;
    auto& uses = b->stream_uses;
    uses.erase(std::remove(uses.begin(), uses.end(), stream.id()), uses.end());
  }

  int format_of(const void* ptr) {
    std::lock_guard<std::mutex> g(mu_);
    const Block* b = active_.find(ptr);
    return b == nullptr ? -1 : b->format;
  }

  bool set_format(const void* ptr, int format) {
    std::lock_guard<std::mutex> g(mu_);
    Block* b = active_.find(ptr);
    if (b == nullptr) return false;
    b->format = format;
    return true;
  }

  int64_t stream_of(const void* ptr) {
    std::lock_guard<std::mutex> g(mu_);
    const Block* b = active_.find(ptr);
    return b == nullptr ? -1 : b->stream;
  }

  int device_of(const void* ptr) {
    std::lock_guard<std::mutex> g(mu_);
    const Block* b = active_.find(ptr);
    return b == nullptr ? -1 : b->device;
  }

  void empty_cache() {
    std::optional<log::Deferred> logs;  // emitted after the lock is released (the Python sink takes the GIL)
    std::lock_guard<std::mutex> g(mu_);
    LogBinding bind(this, &logs);
    for (auto& ds : devices_) {
      flush_pending(ds);
      release_cached(ds);
    }
  }

  DeviceStats stats(int device) {
    std::lock_guard<std::mutex> g(mu_);
    check_device(device);
    return devices_[device].stats;
  }

  void reset_accumulated(int device) {
    std::lock_guard<std::mutex> g(mu_);
    check_device(device);
    auto& s = devices_[device].stats;
    for (int i = 0; i < NUM_STAT_TYPES; ++i) {
      for (StatArray* arr : stat_arrays(s)) (*arr)[i].reset_accumulated();
    }
    s.oversize_allocations.reset_accumulated();
    s.oversize_segments.reset_accumulated();
    s.num_alloc_retries = s.num_ooms = s.num_sync_all_streams = s.num_device_alloc = s.num_device_free = 0;
  }

  void reset_peak(int device) {
    std::lock_guard<std::mutex> g(mu_);
    check_device(device);
    auto& s = devices_[device].stats;
    for (int i = 0; i < NUM_STAT_TYPES; ++i) {
      for (StatArray* arr : stat_arrays(s)) (*arr)[i].reset_peak();
    }
    s.oversize_allocations.reset_peak();
    s.oversize_segments.reset_peak();
  }

  std::vector<SegmentInfo> snapshot() {
    std::lock_guard<std::mutex> g(mu_);
    std::vector<SegmentInfo> out;
    for (size_t d = 0; d < devices_.size(); ++d) {
      std::vector<Block*> heads(devices_[d].segments.begin(), devices_[d].segments.end());
      std::sort(heads.begin(), heads.end(), [](Block* a, Block* b) { return a->ptr < b->ptr; });
      for (Block* h : heads) {
        SegmentInfo si{static_cast<int>(d), reinterpret_cast<int64_t>(h->ptr), 0, 0, 0, 0, h->stream, !h->small, {}};
        for (Block* b = h; b != nullptr; b = b->next) {
          si.total_size += b->size;
          if (b->allocated) {
            si.allocated_size += b->size;
            si.requested_size += b->requested;
          }
          if (!b->is_free()) si.active_size += b->size;
          si.blocks.push_back({reinterpret_cast<int64_t>(b->ptr), static_cast<int64_t>(b->size),
                               static_cast<int64_t>(b->requested), b->allocated, b->pending});
        }
        out.push_back(std::move(si));
      }
    }
    return out;
  }

  void set_fraction(double f, int device) {
    std::lock_guard<std::mutex> g(mu_);
    check_device(device);
    devices_[device].fraction = f;
  }
  double get_fraction(int device) {
    std::lock_guard<std::mutex> g(mu_);
    check_device(device);
    return devices_[device].fraction;
  }

  // A shared-memory segment obtained outside the pools (allocate_shared):
  // counted like a one-block large segment, and against the capacity.
  void* malloc_shared(size_t size, int device, int* handle) {
    std::optional<log::Deferred> logs;  // emitted after the lock is released (the Python sink takes the GIL)
    std::lock_guard<std::mutex> g(mu_);
    LogBinding bind(this, &logs);
    check_device(device);
    DeviceState& ds = devices_[device];
    const uint64_t cap = acl_emu::config().capacity;
    void* p = nullptr;
    if (ds.reserved + size <= limit(ds) && acl_emu::driver_used_bytes(device) + size <= cap) {
      acl_emu::aclrtMallocShareable(&p, size, device, handle);
    }
    if (p == nullptr) {
      ds.stats.num_ooms++;
      TORCH_CHECK_WITH(OutOfMemoryError, false, "NPU out of memory. Tried to allocate ", format_size(size),
                       " of shared memory (NPU ", device, "; ", format_size(cap), " total capacity; ",
                       format_size(ds.reserved), " reserved in total by PyTorch).", PTA_ERROR(ErrCode::MEMORY));
    }
    track_shared(ds, size, +1);
    return p;
  }

  void free_shared(void* ptr, size_t size, int device, int handle) {
    std::lock_guard<std::mutex> g(mu_);
    acl_emu::aclrtFreeShareable(ptr, size, device, handle);
    track_shared(devices_[device], size, -1);
  }

  const AllocConf& conf() const { return conf_; }

 private:
  // Binds a call's log records to the allocator while it holds the lock.
  struct LogBinding {
    Allocator* a;
    LogBinding(Allocator* alloc, std::optional<log::Deferred>* logs) : a(alloc) { a->logs_ = logs; }
    ~LogBinding() { a->logs_ = nullptr; }
  };

  // Records a log line, emitted once the lock is released (dropped outside a
  // call that collects them). The call's Deferred is created on the first
  // record, so a call that logs nothing pays nothing for it.
  C10_NOINLINE void note(int level, std::string message) {
    if (logs_ == nullptr || !log::enabled(log::MEMORY, level)) return;
    if (!logs_->has_value()) logs_->emplace();
    (*logs_)->add(log::MEMORY, level, std::move(message));
  }

  void check_device(int device) {
    if (C10_LIKELY(device >= 0 && device < static_cast<int>(devices_.size()))) return;
    TORCH_CHECK(false, "Invalid device argument ", device, ": did you call init?", PTA_ERROR(ErrCode::PARAM));
  }

  // torch_npu pads every request by 32 bytes before rounding to 512.
  static size_t round_size(size_t size) {
    size += kBlockPad;
    if (size < kMinBlockSize) return kMinBlockSize;
    return kMinBlockSize * ((size + kMinBlockSize - 1) / kMinBlockSize);
  }

  static size_t segment_size(size_t size) {
    if (size <= kSmallSize) return kSmallBuffer;
    if (size < kMinLargeAlloc) return kLargeBuffer;
    return kRoundLarge * ((size + kRoundLarge - 1) / kRoundLarge);
  }

  // The best-fit free block (smallest, then lowest address) for `size` on
  // `stream`; it stays in the pool until take() removes it.
  Block* find_free(Pool& pool, size_t size, int64_t stream) {
    auto it = pool.lower_bound(PoolKey{stream, size, nullptr});
    if (it == pool.end() || it->stream != stream) return nullptr;
    Block* b = it->block;
    // Oversize blocks are not split for smaller requests, and are only
    // reused for requests close to their size (CUDA's rule).
    if (size < conf_.max_split_size && b->size >= conf_.max_split_size) return nullptr;
    if (size >= conf_.max_split_size && b->size >= size + kLargeBuffer) return nullptr;
    return b;
  }

  uint64_t limit(const DeviceState& ds) const {
    return static_cast<uint64_t>(std::floor(acl_emu::config().capacity * ds.fraction));
  }

  // Out of line, as the other slow paths below: the hot malloc/free code stays compact.
  C10_NOINLINE Block* new_segment(DeviceState& ds, int device, size_t rounded, bool small, size_t requested, int64_t stream) {
    size_t seg = segment_size(rounded);
    const uint64_t cap = acl_emu::config().capacity;
    const bool limited = ds.fraction < 1.0;
    auto fits = [&] { return ds.reserved + seg <= limit(ds) && acl_emu::driver_used_bytes(device) + seg <= cap; };
    void* p = nullptr;
    if (fits()) acl_emu::aclrtMalloc(&p, seg, device);
    if (p == nullptr) {
      // Wait for every recorded stream, free every cached segment and retry
      // once, as the real allocator does.
      ds.stats.num_alloc_retries++;
      flush_pending(ds);
      release_cached(ds);
      if (fits()) acl_emu::aclrtMalloc(&p, seg, device);
    }
    if (p == nullptr) {
      ds.stats.num_ooms++;
      if (conf_.conf_fraction > 0 && ds.reserved + seg > limit(ds)) {
        TORCH_CHECK_WITH(OutOfMemoryError, false,
                         "NPU out of memory. Allocation was preemptively rejected because it would exceed "
                         "per_process_memory_fraction limit. Requested size: ",
                         format_size(requested));
      }
      uint64_t used = acl_emu::driver_used_bytes(device);
      uint64_t free_b = cap > used ? cap - used : 0;
      note(log::ERROR, "device " + std::to_string(device) + ": out of memory allocating " + format_size(requested) +
                           " (" + format_size(ds.reserved) + " reserved, " + format_size(free_b) + " free)");
      std::string allowed = limited ? format_size(limit(ds)) + " allowed; " : "";
      TORCH_CHECK_WITH(OutOfMemoryError, false, "NPU out of memory. Tried to allocate ", format_size(requested),
                       " (NPU ", device, "; ", format_size(cap), " total capacity; ",
                       format_size(ds.stats.allocated_bytes[ALL].current), " already allocated; ",
                       format_size(ds.stats.active_bytes[ALL].current), " current active; ", format_size(free_b),
                       " free; ", allowed, format_size(ds.reserved),
                       " reserved in total by PyTorch).If reserved memory is >> allocated memory try setting "
                       "max_split_size_mb to avoid fragmentation.",
                       PTA_ERROR(ErrCode::MEMORY));
    }
    Block* b = Block::make(device, seg, static_cast<char*>(p), small, stream);
    ds.reserved += seg;
    note(log::INFO, "device " + std::to_string(device) + ": new " + (small ? "small" : "large") + " segment of " +
                        format_size(seg) + " (reserved " + format_size(ds.reserved) + ")");
    ds.segments.insert(b);
    ds.stats.num_device_alloc++;
    for (int t : {ALL, small ? SMALL_POOL : LARGE_POOL}) {
      ds.stats.segment[t].increase(1);
      ds.stats.reserved_bytes[t].increase(seg);
    }
    if (seg >= conf_.max_split_size) ds.stats.oversize_segments.increase(1);
    return b;
  }

  // The block for a request of `size` (rounded): `b` (from its pool when
  // `pooled`, or a new segment) split when the rest is worth keeping, the
  // rest going back to the pool. What erase, split and insert would do, but
  // the rest takes over b's pool entry when its key sorts in the same place
  // (the usual case: a remainder shrinking in place), so a steady alloc/free
  // cycle does not rebalance the tree.
  Block* take(DeviceState& ds, Pool& pool, Block* b, bool pooled, size_t size) {
    if (pooled) count_inactive_split(ds, b, -1);
    const size_t remaining = b->size - size;
    const bool should = b->small ? remaining >= kMinBlockSize
                                 : (size < conf_.max_split_size && remaining > kSmallSize);
    if (!should) {
      if (pooled) pool.erase(b->pool_pos);
      return b;
    }
    Block* rest = Block::make(b->device, remaining, b->ptr + size, b->small, b->stream);
    rest->prev = b;
    rest->next = b->next;
    if (rest->next) rest->next->prev = rest;
    b->next = rest;
    b->size = size;
    if (!pooled || !rekey(pool, b->pool_pos, rest)) {
      if (pooled) pool.erase(b->pool_pos);
      // The key is copied: a block's size changes only while it is out of the pool.
      rest->pool_pos = pool.insert(PoolEntry{{rest->stream, rest->size, rest->ptr}, rest}).first;
    }
    count_inactive_split(ds, rest, +1);
    return b;
  }

  // Points the pool entry at `pos` to block `to` (with `to`'s key) if that
  // key sorts between the entry's neighbours; the set stays ordered.
  static bool rekey(Pool& pool, Pool::iterator pos, Block* to) {
    const PoolKey key{to->stream, to->size, to->ptr};
    const BlockLess less;
    if (pos != pool.begin() && !less(*std::prev(pos), key)) return false;
    const auto after = std::next(pos);
    if (after != pool.end() && !less(key, *after)) return false;
    // Set elements are not const objects; only the ordering must hold.
    PoolEntry& e = const_cast<PoolEntry&>(*pos);
    static_cast<PoolKey&>(e) = key;
    e.block = to;
    to->pool_pos = pos;
    return true;
  }

  // A free split block counts as an inactive split while it is in a pool.
  static void count_inactive_split(DeviceState& ds, Block* b, int sign) {
    if (!b->is_split()) return;
    for (int t : {ALL, b->small ? SMALL_POOL : LARGE_POOL}) {
      if (sign > 0) {
        ds.stats.inactive_split[t].increase(1);
        ds.stats.inactive_split_bytes[t].increase(b->size);
      } else {
        ds.stats.inactive_split[t].decrease(1);
        ds.stats.inactive_split_bytes[t].decrease(b->size);
      }
    }
  }

  void erase_free(DeviceState& ds, Pool& pool, Block* b) {
    pool.erase(b->pool_pos);  // by position: no search
    count_inactive_split(ds, b, -1);
  }

  // Returns freed block `b` to its pool, merged with its free neighbours.
  // The merged block takes over a neighbour's pool entry when its key sorts
  // in the same place (see take()).
  Block* merge_into_pool(DeviceState& ds, Pool& pool, Block* b) {
    Block* p = b->prev && b->prev->is_free() ? b->prev : nullptr;
    Block* n = b->next && b->next->is_free() ? b->next : nullptr;
    if (p != nullptr) count_inactive_split(ds, p, -1);
    if (n != nullptr) count_inactive_split(ds, n, -1);
    // The entry to reuse: the next block's (a remainder growing back), else
    // the previous one's; the other is erased.
    Pool::iterator reuse = pool.end();
    if (n != nullptr) {
      reuse = n->pool_pos;
      if (p != nullptr) pool.erase(p->pool_pos);
    } else if (p != nullptr) {
      reuse = p->pool_pos;
    }
    if (p != nullptr) {
      p->size += b->size;
      p->next = b->next;
      if (p->next) p->next->prev = p;
      Block::destroy(b);
      b = p;
    }
    if (n != nullptr) {
      b->size += n->size;
      b->next = n->next;
      if (b->next) b->next->prev = b;
      Block::destroy(n);
    }
    if (reuse == pool.end() || !rekey(pool, reuse, b)) {
      if (reuse != pool.end()) pool.erase(reuse);
      b->pool_pos = pool.insert(PoolEntry{{b->stream, b->size, b->ptr}, b}).first;
    }
    count_inactive_split(ds, b, +1);
    return b;
  }

  void update_alloc_stats(DeviceState& ds, Block* b, int sign) {
    auto& s = ds.stats;
    for (int t : {ALL, b->small ? SMALL_POOL : LARGE_POOL}) {
      if (sign > 0) {
        s.allocation[t].increase(1);
        s.allocated_bytes[t].increase(b->size);
        s.requested_bytes[t].increase(b->requested);
      } else {
        s.allocation[t].decrease(1);
        s.allocated_bytes[t].decrease(b->size);
        s.requested_bytes[t].decrease(b->requested);
      }
    }
    if (b->size >= conf_.max_split_size) {
      if (sign > 0) s.oversize_allocations.increase(1); else s.oversize_allocations.decrease(1);
    }
  }

  // "active" covers a block from its allocation until it is back in a pool,
  // so a block waiting for recorded streams is still active (CUDA's rule).
  static void update_active_stats(DeviceState& ds, Block* b, int sign) {
    for (int t : {ALL, b->small ? SMALL_POOL : LARGE_POOL}) {
      if (sign > 0) {
        ds.stats.active[t].increase(1);
        ds.stats.active_bytes[t].increase(b->size);
      } else {
        ds.stats.active[t].decrease(1);
        ds.stats.active_bytes[t].decrease(b->size);
      }
    }
  }

  void return_to_pool(DeviceState& ds, Block* b) {
    update_active_stats(ds, b, -1);
    b->pending = false;
    b->requested = 0;
    b->stream_uses.clear();
    auto& pool = b->small ? ds.small_free : ds.large_free;
    b = merge_into_pool(ds, pool, b);
    if (conf_.caching_disabled && !b->is_split()) release_segment(ds, pool, b);
  }

  // CUDA's process_events, on a synchronous device. There, a block freed
  // after record_stream(B) returns to its pool when the event recorded on B
  // at the free completes, which the host learns only by querying or
  // synchronising. Here B's work is always done, so the emulator waits for
  // the program's own evidence that B moved past the free: an event recorded
  // on B or a synchronisation of B (or of the device) after the free. Reuse
  // never comes earlier than hardware could allow, and is deterministic.
  C10_NOINLINE void process_pending(DeviceState& ds) {
    std::vector<Block*> still;
    for (Block* b : ds.pending) {
      bool done = true;
      for (int64_t s : b->stream_uses) {
        if (acl_emu::stream_progress(b->device, s) <= b->freed_tick) {
          done = false;
          break;
        }
      }
      if (done) {
        return_to_pool(ds, b);
      } else {
        still.push_back(b);
      }
    }
    ds.pending.swap(still);
  }

  // CUDA's synchronize_and_free_events: wait for every recorded stream (done,
  // on this device) and return all pending blocks.
  void flush_pending(DeviceState& ds) {
    ds.stats.num_sync_all_streams++;
    std::vector<Block*> all;
    all.swap(ds.pending);
    for (Block* b : all) return_to_pool(ds, b);
  }

  void track_shared(DeviceState& ds, size_t size, int sign) {
    auto& s = ds.stats;
    const int64_t n = static_cast<int64_t>(size);
    for (int t : {ALL, LARGE_POOL}) {
      for (StatArray* arr : {&s.segment, &s.allocation, &s.active}) {
        if (sign > 0) (*arr)[t].increase(1); else (*arr)[t].decrease(1);
      }
      for (StatArray* arr : {&s.reserved_bytes, &s.allocated_bytes, &s.active_bytes, &s.requested_bytes}) {
        if (sign > 0) (*arr)[t].increase(n); else (*arr)[t].decrease(n);
      }
    }
    if (sign > 0) {
      ds.reserved += size;
      s.num_device_alloc++;
    } else {
      ds.reserved -= size;
      s.num_device_free++;
    }
  }

  // torch.profiler(profile_memory=True) records npu allocations from here.
  static void report_to_profiler(DeviceState& ds, Block* b, int device, int64_t delta) {
    if (!c10::memoryProfilingEnabled()) return;
    c10::reportMemoryUsageToProfiler(b->ptr, delta, ds.stats.allocated_bytes[ALL].current, ds.reserved,
                                     c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device)));
  }

  void release_segment(DeviceState& ds, Pool& pool, Block* b) {
    erase_free(ds, pool, b);
    acl_emu::aclrtFree(b->ptr, b->size, b->device);
    ds.reserved -= b->size;
    note(log::INFO, "device " + std::to_string(b->device) + ": released a segment of " + format_size(b->size) +
                        " (reserved " + format_size(ds.reserved) + ")");
    ds.segments.erase(b);
    ds.stats.num_device_free++;
    for (int t : {ALL, b->small ? SMALL_POOL : LARGE_POOL}) {
      ds.stats.segment[t].decrease(1);
      ds.stats.reserved_bytes[t].decrease(b->size);
    }
    if (b->size >= conf_.max_split_size) ds.stats.oversize_segments.decrease(1);
    Block::destroy(b);
  }

  void release_cached(DeviceState& ds) {
    for (auto* pool : {&ds.small_free, &ds.large_free}) {
      std::vector<Block*> whole;
      for (const PoolEntry& e : *pool) {
        if (!e.block->is_split()) whole.push_back(e.block);
      }
      for (Block* b : whole) release_segment(ds, *pool, b);
    }
  }

  C10_NOINLINE void maybe_collect(DeviceState& ds) {
    if (conf_.gc_threshold <= 0) return;
    if (ds.reserved > conf_.gc_threshold * limit(ds)) release_cached(ds);
  }

  std::mutex mu_;
  AllocConf conf_;
  std::vector<DeviceState> devices_;
  ActiveMap active_;
  std::optional<log::Deferred>* logs_ = nullptr;  // the current locked call's log records
};

Allocator& instance() {
  static Allocator* a = new Allocator();  // leaked: outlives static tensors
  return *a;
}

void free_fn(void* ptr) {
  if (ptr == nullptr) return;
  if (trace::stream_hooks_on()) trace::fire(trace::Kind::MemoryDeallocation, reinterpret_cast<uintptr_t>(ptr));
  instance().free(ptr);
}

// Pool allocation on the device's current stream, reported to the trace.
void* malloc_on_current_stream(size_t nbytes, int device) {
  void* p = instance().malloc(nbytes, device);
  if (trace::stream_hooks_on()) {
    try {
      trace::fire(trace::Kind::MemoryAllocation, reinterpret_cast<uintptr_t>(p));
    } catch (...) {
      free_fn(p);  // a listener refused it: the caller gets the error, not a leaked block
      throw;
    }
  }
  return p;
}

class NPUAllocator final : public c10::DeviceAllocator {
 public:
  explicit NPUAllocator(int device = -1) : device_(device) {}
  c10::DataPtr allocate(size_t nbytes) override {
    int32_t dev = device_ >= 0 ? device_ : acl_emu::current_device_or_default();
    return torch_npu::allocator::allocate(nbytes, dev, c10::Device(c10::DeviceType::PrivateUse1, dev));
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_fn; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
  bool initialized() override { return true; }
  void emptyCache(c10::MempoolId_t) override { instance().empty_cache(); }
  void recordStream(const c10::DataPtr& data, c10::Stream stream) override { record_stream(data, stream); }
  DeviceStats getDeviceStats(c10::DeviceIndex device) override { return instance().stats(device); }
  void resetAccumulatedStats(c10::DeviceIndex device) override { instance().reset_accumulated(device); }
  void resetPeakStats(c10::DeviceIndex device) override { instance().reset_peak(device); }
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    auto r = mem_get_info(device);
    return {static_cast<size_t>(r.first), static_cast<size_t>(r.second)};
  }

 private:
  int device_;
};

NPUAllocator g_npu_allocator;

}  // namespace

c10::Allocator* get() { return &g_npu_allocator; }

c10::Allocator* get(int device) {
  static std::vector<NPUAllocator*>* per_device = [] {
    auto* v = new std::vector<NPUAllocator*>();
    for (int i = 0; i < 64; ++i) v->push_back(new NPUAllocator(i));
    return v;
  }();
  return (*per_device)[device];
}

c10::DataPtr allocate(size_t nbytes, int device, c10::Device label) {
  if (nbytes == 0) return {nullptr, nullptr, &free_fn, label};
  void* p = malloc_on_current_stream(nbytes, device);
  return {p, p, &free_fn, label};
}

void free_ptr(void* ptr) { free_fn(ptr); }

namespace {
struct SharedBlock {
  void* ptr;
  size_t size;
  int device;
  int handle;
  bool owner;  // allocated here (counted) rather than imported
};

void free_shared_block(void* ctx) {
  auto* b = static_cast<SharedBlock*>(ctx);
  if (b->owner) {
    instance().free_shared(b->ptr, b->size, b->device, b->handle);
  } else {
    acl_emu::aclrtUnmapShareable(b->ptr, b->size, b->handle);
  }
  delete b;
}
}  // namespace

c10::DataPtr allocate_shared(size_t nbytes, int device) {
  int handle = -1;
  void* p = instance().malloc_shared(nbytes, device, &handle);
  auto* b = new SharedBlock{p, nbytes, device, handle, true};
  return {p, b, &free_shared_block, c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device))};
}

c10::DataPtr import_shared(int handle, size_t nbytes, int device) {
  TORCH_CHECK(acl_emu::is_valid_device(device), "Invalid device argument ", device, PTA_ERROR(ErrCode::PARAM));
  void* p = nullptr;
  NPU_CHECK_ERROR(acl_emu::aclrtMapShareable(handle, nbytes, &p));
  auto* b = new SharedBlock{p, nbytes, device, handle, false};
  return {p, b, &free_shared_block, c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device))};
}

int shared_handle(const c10::DataPtr& data) {
  if (data.get_deleter() != &free_shared_block) return -1;
  return static_cast<SharedBlock*>(data.get_context())->handle;
}


c10::DeleterFnPtr deleter() { return &free_fn; }
int device_of(const void* ptr) { return instance().device_of(ptr); }
int64_t stream_of(const void* ptr) { return instance().stream_of(ptr); }
int storage_format(const void* ptr) { return instance().format_of(ptr); }
bool set_storage_format(const void* ptr, int format) { return instance().set_format(ptr, format); }

void* raw_alloc(size_t nbytes, int device) {
  return nbytes == 0 ? nullptr : malloc_on_current_stream(nbytes, device);
}
void raw_delete(void* ptr) { free_fn(ptr); }

void record_stream(const c10::DataPtr& data, const c10::Stream& stream) {
  // Only our pool blocks (context == pointer) carry stream uses; shared
  // memory and foreign DataPtrs are left alone, as CUDA does.
  if (data.get_deleter() != &free_fn || data.get() == nullptr) return;
  if (trace::stream_hooks_on()) {
    trace::fire(trace::Kind::RecordStream, reinterpret_cast<uintptr_t>(data.get()), trace::stream_handle(stream));
  }
  instance().record_stream(data.get(), stream);
}

void erase_stream(const c10::DataPtr& data, const c10::Stream& stream) {
  if (data.get_deleter() != &free_fn || data.get() == nullptr) return;
  if (trace::stream_hooks_on()) {
    trace::fire(trace::Kind::EraseStream, reinterpret_cast<uintptr_t>(data.get()), trace::stream_handle(stream));
  }
  instance().erase_stream(data.get(), stream);
}

void init() { instance(); }
void empty_cache() { instance().empty_cache(); }
DeviceStats stats(int device) { return instance().stats(device); }
void reset_accumulated_stats(int device) { instance().reset_accumulated(device); }
void reset_peak_stats(int device) { instance().reset_peak(device); }
std::vector<SegmentInfo> snapshot() { return instance().snapshot(); }
void set_memory_fraction(double fraction, int device) { instance().set_fraction(fraction, device); }
double get_memory_fraction(int device) { return instance().get_fraction(device); }

std::pair<uint64_t, uint64_t> mem_get_info(int device) {
  uint64_t cap = acl_emu::config().capacity;
  uint64_t used = acl_emu::driver_used_bytes(device);
  return {cap > used ? cap - used : 0, cap};
}

std::string config_string() { return instance().conf().text; }

}  // namespace torch_npu::allocator
