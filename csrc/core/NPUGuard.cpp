#include "core/NPUGuard.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <vector>

#include "core/NPUCachingAllocator.h"
#include "core/NPUException.h"
#include "core/NPUTrace.h"
#include "runtime/AclRuntime.h"

namespace torch_npu {
namespace {

constexpr c10::DeviceType kNPU = c10::DeviceType::PrivateUse1;

std::vector<c10::StreamId>& tls_streams() {
  thread_local std::vector<c10::StreamId> streams(64, 0);
  return streams;
}

int checked(c10::DeviceIndex d) {
  TORCH_CHECK(acl_emu::is_valid_device(d), "Invalid device_index : ", static_cast<int>(d),
              PTA_ERROR(ErrCode::VALUE));
  return d;
}

struct NPUGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kNPU; }

  c10::Device exchangeDevice(c10::Device d) const override {
    c10::Device old = getDevice();
    if (old.index() != d.index()) setDevice(d);
    return old;
  }
  c10::Device getDevice() const override {
    int32_t d = 0;
    acl_emu::aclrtGetDevice(&d);
    return c10::Device(kNPU, static_cast<c10::DeviceIndex>(d));
  }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kNPU, "Expected a NPU device, but got ", d);
    NPU_CHECK_ERROR(acl_emu::aclrtSetDevice(d.index()));
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override { acl_emu::aclrtSetDevice(d.index()); }

  c10::Stream getStream(c10::Device d) const override { return current_stream(d.index()); }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kNPU, checked(d.index())), 0);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool isHighPriority) const override {
    return getNewStream(d, isHighPriority ? -1 : 0);
  }
  c10::Stream getNewStream(c10::Device d, int priority) const override {
    int dev = d.has_index() ? d.index() : acl_emu::current_device_or_default();
    checked(dev);
    c10::Stream s(c10::Stream::UNSAFE, c10::Device(kNPU, dev), acl_emu::stream_create(dev, priority));
    if (trace::stream_hooks_on()) trace::fire(trace::Kind::StreamCreation, trace::stream_handle(s));
    return s;
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    c10::Stream old = current_stream(s.device_index());
    set_current_stream(s);
    return old;
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    uint32_t n = 0;
    acl_emu::aclrtGetDeviceCount(&n);
    return static_cast<c10::DeviceIndex>(n);
  }

  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag flag) const override {
    TORCH_CHECK(device_index == -1 || device_index == stream.device_index(), "Event device index ",
                static_cast<int>(device_index), " does not match recording stream's device index ",
                static_cast<int>(stream.device_index()), ".");
    auto* e = static_cast<EmuEvent*>(*event);
    if (e == nullptr) {
      // Created at its first record, as CUDA's events are.
      e = new EmuEvent();
      e->timing = flag == c10::EventFlag::BACKEND_DEFAULT;
      *event = e;
      if (trace::stream_hooks_on()) trace::fire(trace::Kind::EventCreation, event_handle(e));
    }
    e->device = stream.device_index();
    e->recorded_us = acl_emu::now_us();
    acl_emu::note_stream_progress(stream.device_index(), stream.id());
    if (trace::stream_hooks_on()) trace::fire(trace::Kind::EventRecord, event_handle(e), trace::stream_handle(stream));
  }
  void block(void* event, const c10::Stream& stream) const override {
    if (event != nullptr && trace::stream_hooks_on()) {
      trace::fire(trace::Kind::EventWait, event_handle(event), trace::stream_handle(stream));
    }
  }
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    if (event == nullptr) return;
    if (trace::stream_hooks_on()) trace::fire(trace::Kind::EventDeletion, event_handle(event));  // never throws
    delete static_cast<EmuEvent*>(event);
  }
  // Every dtype can be allocated on the emulated device and converted there
  // (torch.accelerator.get_device_capability reads this).
  c10::DeviceCapability getDeviceCapability(c10::Device d) const override {
    TORCH_CHECK(acl_emu::is_valid_device(d.index()), "Invalid device_index : ", static_cast<int>(d.index()),
                PTA_ERROR(ErrCode::VALUE));
    return c10::DeviceCapability();
  }
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream& stream) const override { synchronize_stream(stream); }
  void synchronizeEvent(void* event) const override {
    if (event != nullptr && trace::stream_hooks_on()) trace::fire(trace::Kind::EventSynchronization, event_handle(event));
  }
  void synchronizeDevice(const c10::DeviceIndex device) const override {
    synchronize_device(device < 0 ? acl_emu::current_device_or_default() : device);
  }
  void recordDataPtrOnStream(const c10::DataPtr& data, const c10::Stream& stream) const override {
    allocator::record_stream(data, stream);
  }
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    auto* a = static_cast<EmuEvent*>(start);
    auto* b = static_cast<EmuEvent*>(end);
    TORCH_CHECK(a && b && a->recorded_us >= 0 && b->recorded_us >= 0,
                "Both events must be recorded before calculating elapsed time.", PTA_ERROR(ErrCode::PARAM));
    TORCH_CHECK(a->timing && b->timing,
                "Both events must be created with argument 'enable_timing=True'.", PTA_ERROR(ErrCode::PARAM));
    // Device clocks are not comparable; CUDA fails here too (invalid resource handle).
    TORCH_CHECK(a->device == b->device,
                "Both events must be recorded on the same device to calculate elapsed time, but the start event "
                "was recorded on npu:", static_cast<int>(a->device), " and the end event on npu:",
                static_cast<int>(b->device), ".", PTA_ERROR(ErrCode::PARAM));
    return (b->recorded_us - a->recorded_us) / 1000.0;
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, NPUGuardImpl);

}  // namespace

uint64_t event_handle(const void* event) { return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(event)); }

void synchronize_stream(const c10::Stream& stream) {
  acl_emu::note_stream_progress(stream.device_index(), stream.id());
  if (trace::stream_hooks_on()) trace::fire(trace::Kind::StreamSynchronization, trace::stream_handle(stream));
}

void synchronize_device(int device) {
  checked(device);
  acl_emu::note_device_synchronized(device);
  if (trace::stream_hooks_on()) trace::fire(trace::Kind::DeviceSynchronization);
}

c10::Stream current_stream(int device) {
  if (device < 0) device = acl_emu::current_device_or_default();
  checked(device);
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(kNPU, device), tls_streams()[device]);
}

c10::StreamId current_stream_id(int device) { return tls_streams()[device]; }

void set_current_stream(const c10::Stream& stream) {
  checked(stream.device_index());
  tls_streams()[stream.device_index()] = stream.id();
}

}  // namespace torch_npu
