// Per-device random generator with torch_npu's 16-byte state
// [seed:uint64 | offset:int64]. Like Philox on the device, the numbers an op
// draws depend only on (seed, offset); the offset advances with each op.
// CPU kernels only accept a CPUGeneratorImpl, so each random op gets a CPU
// engine seeded from (seed, offset) in place of this generator.
#pragma once

#include <ATen/core/Generator.h>
#include <c10/core/GeneratorImpl.h>

#include <mutex>

namespace torch_npu {

class NPUGeneratorImpl : public c10::GeneratorImpl {
 public:
  explicit NPUGeneratorImpl(c10::DeviceIndex device, uint64_t seed = c10::default_rng_seed_val);
  ~NPUGeneratorImpl() override = default;

  void set_current_seed(uint64_t seed) override;
  uint64_t current_seed() const override;
  uint64_t seed() override;
  void set_offset(uint64_t offset) override;
  uint64_t get_offset() const override;
  void set_state(const c10::TensorImpl& new_state) override;
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override;
  static c10::DeviceType device_type() { return c10::DeviceType::PrivateUse1; }

  // A CPU generator for one random op touching `numel` elements; advances
  // the offset. Thread-safe.
  at::Generator engine_for_op(int64_t numel);

 private:
  NPUGeneratorImpl* clone_impl() const override;
  uint64_t seed_;
  uint64_t offset_ = 0;
};

const at::Generator& default_generator(c10::DeviceIndex device);
at::Generator make_generator(c10::DeviceIndex device);

}  // namespace torch_npu
