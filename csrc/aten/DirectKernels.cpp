// The few ops that need an npu kernel of their own: factories (they own the
// device pool), copies across devices, views and metadata ops (they must
// share the npu storage, not an alias), scalar reads, and the ops whose
// non-CPU code path has no CPU kernel (convolution's overrideable backend).
#include <ATen/Context.h>
#include <ATen/EmptyTensor.h>
#include <ATen/native/ResizeCommon.h>
#include <ATen/native/TensorFactories.h>
#include <ATen/ops/_local_scalar_dense.h>
#include <ATen/ops/arange_ops.h>
#include <ATen/ops/arange_native.h>
#include <ATen/ops/convolution.h>
#include <ATen/ops/convolution_backward.h>
#include <ATen/ops/histc.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/StorageImpl.h>
#include <torch/library.h>

#include <cstring>

#include "aten/OpExecution.h"
#include "core/NPUCachingAllocator.h"
#include "core/NPUException.h"
#include "runtime/AclRuntime.h"

namespace torch_npu::kernels {
namespace {

using exec::cpu_alias;

int resolve_device(std::optional<at::Device> device) {
  int d = (device.has_value() && device->has_index()) ? device->index() : acl_emu::current_device_or_default();
  NPU_CHECK_ERROR(acl_emu::aclrtCheckDevice(d));
  return d;
}

const c10::DispatchKeySet kNpuKeys(c10::DispatchKey::PrivateUse1);

// torch.use_deterministic_algorithms(True) (with fill_uninitialized_memory,
// the default) makes empty tensors NaN / the integer maximum, as on CPU and CUDA.
bool fill_uninitialized() {
  const auto& ctx = at::globalContext();
  return ctx.deterministicAlgorithms() && ctx.deterministicFillUninitializedMemory();
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<at::ScalarType> dtype,
                               std::optional<at::Layout> layout, std::optional<at::Device> device,
                               std::optional<bool> pin_memory, std::optional<at::MemoryFormat> memory_format) {
  TORCH_CHECK(!pin_memory.has_value() || !*pin_memory, "Only dense CPU tensors can be pinned");
  TORCH_CHECK(!layout.has_value() || *layout == at::kStrided,
              "CAUTION: The operator 'aten::empty.memory_format' is not currently supported on the NPU backend "
              "for layout ", *layout, ".", OPS_ERROR(ErrCode::NOT_SUPPORT));
  int d = resolve_device(device);
  at::Tensor t = at::detail::empty_generic(size, allocator::get(d), kNpuKeys, c10::dtype_or_default(dtype),
                                           memory_format);
  if (fill_uninitialized()) at::native::fill_empty_deterministic_(t);
  return t;
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<at::ScalarType> dtype,
                         std::optional<at::Layout> layout, std::optional<at::Device> device,
                         std::optional<bool> pin_memory) {
  TORCH_CHECK(!pin_memory.has_value() || !*pin_memory, "Only dense CPU tensors can be pinned");
  int d = resolve_device(device);
  at::Tensor t = at::detail::empty_strided_generic(size, stride, allocator::get(d), kNpuKeys,
                                                   c10::dtype_or_default(dtype));
  if (fill_uninitialized()) at::native::fill_empty_deterministic_(t);
  return t;
}

// Allocator for efficient zero tensors: no memory, an npu label.
class ZeroAllocator final : public c10::Allocator {
 public:
  explicit ZeroAllocator(c10::Device d) : device_(d) {}
  c10::DataPtr allocate(size_t) override { return {nullptr, nullptr, &noop, device_}; }
  c10::DeleterFnPtr raw_deleter() const override { return &noop; }
  void copy_data(void*, const void*, std::size_t) const override {}

 private:
  static void noop(void*) {}
  c10::Device device_;
};

at::Tensor efficientzerotensor(c10::IntArrayRef size, std::optional<at::ScalarType> dtype,
                               std::optional<at::Layout> layout, std::optional<at::Device> device,
                               std::optional<bool> pin_memory) {
  int d = resolve_device(device);
  ZeroAllocator zero(c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(d)));
  auto keys = kNpuKeys | c10::DispatchKeySet(c10::DispatchKey::ZeroTensor);
  return at::detail::empty_generic(size, &zero, keys, c10::dtype_or_default(dtype), std::nullopt);
}

bool is_npu(const at::Tensor& t) { return t.device().type() == c10::DeviceType::PrivateUse1; }

at::Tensor& copy_(at::Tensor& self, const at::Tensor& src, bool /*non_blocking*/) {
  if (self.is_same(src)) return self;
  // The emulated device executes synchronously, so non_blocking copies are
  // complete on return, exactly like a blocking copy.
  // A CPU side is borrowed, not copied: a copy of a tensor Python owns
  // increfs its PyObject under the GIL (see aten/UnboxedKernels.cpp).
  auto dst = is_npu(self) ? c10::MaybeOwned<at::Tensor>::owned(cpu_alias(self))
                          : c10::MaybeOwned<at::Tensor>::borrowed(self);
  c10::MaybeOwned<at::Tensor> from;
  if (is_npu(src) && is_npu(self) && src.storage().is_alias_of(self.storage())) {
    // Same memory: share the alias storage so the CPU overlap check applies.
    from = c10::MaybeOwned<at::Tensor>::owned(cpu_alias(src, dst->storage()));
  } else {
    from = is_npu(src) ? c10::MaybeOwned<at::Tensor>::owned(cpu_alias(src))
                       : c10::MaybeOwned<at::Tensor>::borrowed(src);
  }
  TORCH_CHECK(dst->is_cpu() && from->is_cpu(), "copy_ between ", self.device(), " and ", src.device(),
              " is not supported on the NPU backend.", OPS_ERROR(ErrCode::NOT_SUPPORT));
  int d = is_npu(self) ? self.device().index() : src.device().index();
  NPU_KERNEL_SCOPE("aten::copy_", "", d);
  dst->copy_(*from);
  return self;
}

at::Tensor _copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  at::Tensor out = dst;
  copy_(out, self, non_blocking);
  return dst;
}

at::Tensor _copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  if (dst.sizes() != self.sizes()) dst.resize_(self.sizes());
  at::Tensor out = dst;
  copy_(out, self, false);
  return dst;
}

// Grow `storage` to at least `nbytes` bytes on its own device, keeping data.
void grow_storage(c10::StorageImpl* storage, size_t nbytes) {
  if (nbytes <= storage->nbytes()) return;
  TORCH_CHECK(storage->resizable(), "Trying to resize storage that is not resizable");
  int d = storage->device().index();
  c10::DataPtr dp = allocator::allocate(nbytes, d, c10::Device(c10::DeviceType::PrivateUse1, d));
  size_t old = storage->nbytes();
  if (old > 0 && storage->data() != nullptr) std::memcpy(dp.get(), storage->data(), old);
  storage->set_data_ptr_noswap(std::move(dp));
  storage->set_nbytes(nbytes);
}

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size,
                          std::optional<at::MemoryFormat> memory_format) {
  c10::TensorImpl* impl = self.unsafeGetTensorImpl();
  const int64_t old_nbytes = static_cast<int64_t>(impl->unsafe_storage().nbytes());
  // Same sizes: strides and storage stay, as on CPU (a non-contiguous out=
  // resized to its own shape by a composite out kernel keeps its layout).
  if (impl->sizes() != size) {
    impl->set_sizes_contiguous(size);
    const size_t needed = at::detail::computeStorageNbytesContiguous(size, self.dtype().itemsize(),
                                                                     impl->storage_offset());
    if (self.numel() > 0) grow_storage(impl->unsafe_storage().unsafeGetStorageImpl(), needed);
    if (fill_uninitialized()) at::native::fill_resize_deterministic_(self, old_nbytes);
  }
  if (memory_format.has_value()) {
    TORCH_CHECK(*memory_format != at::MemoryFormat::Preserve,
                "Unsupported memory format", *memory_format);
    impl->empty_tensor_restride(*memory_format);
  }
  return self;
}

void check_set_storage(const at::Tensor& self, const c10::Storage& source) {
  TORCH_CHECK(source.device() == self.storage().device() || !self.storage().data(),
              "Attempted to set the storage of a tensor on device \"", self.storage().device(),
              "\" to a storage on different device \"", source.device(),
              "\".  This is no longer allowed; the devices must match.");
  TORCH_CHECK(source.device().type() == c10::DeviceType::PrivateUse1,
              "Expected NPU tensor, please check whether the input tensor device is correct.",
              PTA_ERROR(ErrCode::PARAM));
}

at::Tensor& set_storage_offset(at::Tensor& self, c10::Storage source, int64_t offset, c10::IntArrayRef size,
                               c10::IntArrayRef stride) {
  check_set_storage(self, source);
  c10::TensorImpl* impl = self.unsafeGetTensorImpl();
  impl->set_storage_keep_dtype(source);
  impl->set_storage_offset(offset);
  if (stride.empty()) {
    impl->set_sizes_contiguous(size);
  } else {
    impl->set_sizes_and_strides(size, stride);
  }
  size_t needed = stride.empty()
                      ? at::detail::computeStorageNbytesContiguous(size, self.dtype().itemsize(), offset)
                      : at::detail::computeStorageNbytes(size, stride, self.dtype().itemsize(), offset);
  if (self.numel() > 0) grow_storage(impl->unsafe_storage().unsafeGetStorageImpl(), needed);
  return self;
}

at::Tensor& set_storage(at::Tensor& self, c10::Storage source) {
  int64_t n = static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  return set_storage_offset(self, source, 0, {n}, {});
}

at::Tensor& set_tensor(at::Tensor& self, const at::Tensor& source) {
  if (self.is_same(source)) return self;
  return set_storage_offset(self, source.storage(), source.storage_offset(), source.sizes(), source.strides());
}

at::Tensor& set_empty(at::Tensor& self) {
  int d = self.device().index();
  c10::Storage empty(c10::Storage::use_byte_size_t(), 0, allocator::get(d), true);
  return set_storage_offset(self, empty, 0, {0}, {});
}

// Module.to("npu") keeps parameter identity (param.data = moved) when this
// says CPU and npu tensors are interchangeable, as CPU and CUDA are; c10's
// own rule only knows the built-in dense backends.
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  auto plain = [](const at::Tensor& t) {
    return t.layout() == c10::kStrided && !t.is_nested() && (t.device().is_cpu() || is_npu(t));
  };
  return plain(self) && plain(from);
}

bool is_set_to(const at::Tensor& self, const at::Tensor& other) {
  return self.storage().unsafeGetStorageImpl() == other.storage().unsafeGetStorageImpl() &&
         self.storage_offset() == other.storage_offset() && self.sizes().equals(other.sizes()) &&
         self.strides().equals(other.strides());
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  NPU_KERNEL_SCOPE("aten::_local_scalar_dense", "", self.device().index());
  return at::_local_scalar_dense(cpu_alias(self));
}

void record_stream(at::Tensor& self, c10::Stream stream) {
  // The caching allocator delays the block's reuse for `stream` (stream-ordered pools).
  allocator::record_stream(self.storage().data_ptr(), stream);
}

at::Tensor convolution_overrideable(const at::Tensor& input, const at::Tensor& weight,
                                    const std::optional<at::Tensor>& bias, c10::IntArrayRef stride,
                                    c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
                                    c10::IntArrayRef output_padding, int64_t groups) {
  int d = input.device().index();
  std::optional<at::Tensor> b;
  if (bias.has_value() && bias->defined()) b = cpu_alias(*bias);
  at::Tensor out;
  {
    NPU_KERNEL_SCOPE("aten::convolution_overrideable", "", d);
    out = at::convolution(cpu_alias(input), cpu_alias(weight), b, stride, padding, dilation, transposed,
                          output_padding, groups);
  }
  return exec::adopt_result(out, d);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward_overrideable(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight, c10::IntArrayRef stride,
    c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed, c10::IntArrayRef output_padding,
    int64_t groups, std::array<bool, 3> output_mask) {
  int d = input.device().index();
  std::vector<int64_t> bias_sizes{transposed ? weight.size(1) * groups : weight.size(0)};
  at::Tensor gi, gw, gb;
  {
    NPU_KERNEL_SCOPE("aten::convolution_backward_overrideable", "", d);
    std::tie(gi, gw, gb) =
        at::convolution_backward(cpu_alias(grad_output), cpu_alias(input), cpu_alias(weight), bias_sizes, stride,
                                 padding, dilation, transposed, output_padding, groups, output_mask);
  }
  return {exec::adopt_result(gi, d), exec::adopt_result(gw, d), exec::adopt_result(gb, d)};
}

// The NPU's histc counts integer inputs as well (aclnnHistc takes INT8-INT64 and
// UINT8, and returns the input's dtype); ATen's CPU kernel takes floating types
// only. transformers' MoE experts call it on int32 expert ids on any non-CPU
// device. Integers are counted in double, exact for |x| < 2^53.
at::Tensor histc(const at::Tensor& self, int64_t bins, const at::Scalar& min, const at::Scalar& max) {
  int d = self.device().index();
  at::Tensor out;
  {
    NPU_KERNEL_SCOPE("aten::histc", "", d);
    at::Tensor x = cpu_alias(self);
    if (at::isIntegralType(x.scalar_type(), /*includeBool=*/false)) {
      out = at::histc(x.to(at::kDouble), bins, min, max).to(x.scalar_type());
    } else {
      out = at::histc(x, bins, min, max);
    }
  }
  return exec::adopt_result(out, d);
}

// arange's functional forms, which torch_npu lists as NPU kernels: the CPU
// composite (an empty tensor, then arange.start_out's CPU kernel) inside the
// kernel scope, so that the result is made in device memory and adopted; one
// kernel instead of the composite's npu empty and a boxed arange.start_out.
// Pinned or non-strided requests go the composite's way (the npu empty's errors).
at::Tensor arange_start_step(const at::Scalar& start, const at::Scalar& end, const at::Scalar& step,
                             std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                             std::optional<at::Device> device, std::optional<bool> pin_memory) {
  if ((pin_memory.has_value() && *pin_memory) || (layout.has_value() && *layout != at::kStrided)) {
    return at::native::arange(start, end, step, dtype, layout, device, pin_memory);
  }
  const int d = resolve_device(device);
  at::Tensor r;
  {
    NPU_KERNEL_SCOPE("aten::arange", "start_step", d);
    r = at::_ops::arange_start_step::redispatch(c10::DispatchKeySet(c10::DispatchKey::CPU), start, end, step, dtype,
                                                layout, at::Device(at::kCPU), pin_memory);
  }
  return exec::adopt_result_in_place(std::move(r), d);
}

// arange(end) and arange(start, end) as their composites spell them (an int 0
// start, an int 1 step: they take part in the dtype inference), without the hops.
at::Tensor arange_end(const at::Scalar& end, std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                      std::optional<at::Device> device, std::optional<bool> pin_memory) {
  return arange_start_step(/*start=*/0, end, /*step=*/1, dtype, layout, device, pin_memory);
}

at::Tensor arange_start(const at::Scalar& start, const at::Scalar& end, std::optional<at::ScalarType> dtype,
                        std::optional<at::Layout> layout, std::optional<at::Device> device,
                        std::optional<bool> pin_memory) {
  return arange_start_step(start, end, /*step=*/1, dtype, layout, device, pin_memory);
}

}  // namespace
}  // namespace torch_npu::kernels

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  using namespace torch_npu::kernels;
  m.impl("empty.memory_format", &empty_memory_format);
  m.impl("empty_strided", &empty_strided);
  m.impl("_efficientzerotensor", &efficientzerotensor);
  m.impl("copy_", &copy_);
  m.impl("_copy_from", &_copy_from);
  m.impl("_copy_from_and_resize", &_copy_from_and_resize);
  m.impl("view", &at::native::view);
  m.impl("as_strided", &at::native::as_strided_tensorimpl);
  m.impl("_reshape_alias", &at::native::_reshape_alias);
  m.impl("unfold", &at::native::unfold);
  m.impl("view_as_real", &at::native::view_as_real);
  m.impl("view_as_complex", &at::native::view_as_complex);
  m.impl("resize_", &resize_);
  m.impl("set_.source_Storage_storage_offset", &set_storage_offset);
  m.impl("set_.source_Storage", &set_storage);
  m.impl("set_.source_Tensor", &set_tensor);
  m.impl("set_", &set_empty);
  m.impl("is_set_to", &is_set_to);
  m.impl("_has_compatible_shallow_copy_type", &has_compatible_shallow_copy_type);
  m.impl("_local_scalar_dense", &local_scalar_dense);
  m.impl("record_stream", &record_stream);
  m.impl("convolution_overrideable", &convolution_overrideable);
  m.impl("convolution_backward_overrideable", &convolution_backward_overrideable);
  m.impl("histc", &histc);
  m.impl("arange", &arange_end);
  m.impl("arange.start", &arange_start);
  m.impl("arange.start_step", &arange_start_step);
}
