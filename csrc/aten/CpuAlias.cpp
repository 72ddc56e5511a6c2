// CPU aliases of device memory, the redirecting CPU allocator, and adoption
// of kernel results as npu tensors.
#include <ATen/EmptyTensor.h>
#include <cstring>
#include <typeinfo>
#include <vector>
#include <ATen/core/Tensor.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/TensorImpl.h>

#include "aten/OpExecution.h"
#include "core/NPUCachingAllocator.h"

namespace torch_npu::exec {
namespace {

thread_local int tls_redirect_device = -1;
c10::Allocator* g_orig_cpu = nullptr;

// Frees device blocks by pointer (mkldnn's raw_deallocate path) and
// everything else through the original CPU allocator.
void dual_raw_free(void* ptr) {
  if (ptr == nullptr) return;
  if (allocator::device_of(ptr) >= 0) {
    allocator::free_ptr(ptr);
  } else {
    g_orig_cpu->raw_deleter()(ptr);
  }
}

class RedirectingCPUAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    if (tls_redirect_device >= 0) {
      return allocator::allocate(nbytes, tls_redirect_device, c10::Device(c10::DeviceType::CPU));
    }
    return g_orig_cpu->allocate(nbytes);
  }
  c10::DeleterFnPtr raw_deleter() const override { return &dual_raw_free; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

RedirectingCPUAllocator g_redirect;

void noop_delete(void*) {}

}  // namespace

DeviceMemoryScope::DeviceMemoryScope(int device) : slot_(&tls_redirect_device), prev_(*slot_) { *slot_ = device; }
DeviceMemoryScope::~DeviceMemoryScope() { *slot_ = prev_; }

void install_cpu_allocator() {
  if (g_orig_cpu != nullptr) return;
  g_orig_cpu = c10::GetCPUAllocator();
  c10::SetCPUAllocator(&g_redirect, /*priority=*/100);
}

c10::Storage alias_storage(const c10::Storage& st) {
  void* data = const_cast<void*>(st.data());
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), st.sym_nbytes(),
      c10::DataPtr(data, nullptr, &noop_delete, c10::Device(c10::DeviceType::CPU)), &g_redirect,
      /*resizable=*/true));
}

namespace {
// The TensorImpl of a CPU alias: a TensorImpl that takes another one's
// geometry as it is. set_sizes_and_strides would recompute numel and the
// contiguity flags TensorImpl caches (for 4-d tensors, the channels-last
// ones too), the larger part of an alias's cost; the npu tensor has them.
class AliasImpl final : public c10::TensorImpl {
 public:
  AliasImpl(c10::Storage&& storage, const caffe2::TypeMeta dtype)
      : c10::TensorImpl(std::move(storage), c10::DispatchKeySet(c10::DispatchKey::CPU), dtype) {}

  // t's sizes, strides, storage offset, numel and contiguity flags. t is a
  // plain TensorImpl (default size/stride policy, no symbolic sizes): its
  // cached flags are read as they are.
  void take_geometry(const c10::TensorImpl* t) {
    const c10::IntArrayRef sizes = t->sizes(), strides = t->strides();
    // element by element: dims are few, and std::copy would call memmove twice
    sizes_and_strides_.resize(sizes.size());
    for (size_t i = 0; i < sizes.size(); ++i) {
      sizes_and_strides_.size_at_unchecked(i) = sizes[i];
      sizes_and_strides_.stride_at_unchecked(i) = strides[i];
    }
    storage_offset_ = t->storage_offset();
    numel_ = t->numel();
    is_contiguous_ = t->is_contiguous_default(at::MemoryFormat::Contiguous);
    is_non_overlapping_and_dense_ = t->is_non_overlapping_and_dense_default();
    if (sizes.size() == 4 || sizes.size() == 5) {
      is_channels_last_contiguous_ = t->is_contiguous_default(at::MemoryFormat::ChannelsLast);
      is_channels_last_3d_contiguous_ = t->is_contiguous_default(at::MemoryFormat::ChannelsLast3d);
      is_channels_last_ = t->is_strides_like_default(at::MemoryFormat::ChannelsLast);
      is_channels_last_3d_ = t->is_strides_like_default(at::MemoryFormat::ChannelsLast3d);
    } else {
      // what TensorImpl::_refresh_contiguous sets for the other ranks
      is_channels_last_contiguous_ = false;
      is_channels_last_3d_contiguous_ = false;
      is_channels_last_ = false;
      is_channels_last_3d_ = false;
    }
  }

  // The storage and dtype of an alias of t (set_storage_and_dtype, skipping the
  // reference count traffic when the storage is already this alias's own).
  void take_storage(const c10::Storage& storage, const caffe2::TypeMeta dtype) {
    if (storage_.unsafeGetStorageImpl() != storage.unsafeGetStorageImpl()) set_storage_keep_dtype(storage);
    data_type_ = dtype;
  }
};

// A TensorImpl whose cached geometry take_geometry may read as it is: a plain
// one (not a subclass with its own size/stride policy) without symbolic sizes,
// and not a Python tensor (a wrapper subclass may answer sizes and strides
// from Python: those are read through the policy-aware accessors instead).
bool plain_geometry(const c10::TensorImpl* t) {
  return (typeid(*t) == typeid(c10::TensorImpl) || typeid(*t) == typeid(AliasImpl)) &&
         !t->has_symbolic_sizes_strides() && !t->key_set().has(c10::DispatchKey::Python);
}

void take_geometry_and_flags(AliasImpl* a, const c10::TensorImpl* t) {
  if (C10_LIKELY(plain_geometry(t))) {
    a->take_geometry(t);
  } else {
    a->set_sizes_and_strides(t->sizes(), t->strides(), t->storage_offset());
  }
  if (C10_UNLIKELY(a->is_conj() != t->is_conj())) a->_set_conj(t->is_conj());
  if (C10_UNLIKELY(a->is_neg() != t->is_neg())) a->_set_neg(t->is_neg());
}

at::Tensor as_tensor(c10::intrusive_ptr<AliasImpl>&& impl) {
  return at::Tensor(c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>::reclaim(impl.release()));
}
}  // namespace

at::Tensor cpu_alias(const at::Tensor& t, c10::Storage storage) {
  auto impl = c10::make_intrusive<AliasImpl>(std::move(storage), t.dtype());
  take_geometry_and_flags(impl.get(), t.unsafeGetTensorImpl());
  return as_tensor(std::move(impl));
}

namespace {
// Alias TensorImpls (each with its own alias StorageImpl) that unboxed calls
// gave back, for the next calls on this thread: an op then builds no
// TensorImpl, StorageImpl or version counter per argument, and frees none.
constexpr size_t kAliasPoolSize = 8;
thread_local AliasPool tls_alias_pool;
}  // namespace

AliasPool& this_thread_alias_pool() { return tls_alias_pool; }

at::Tensor pooled_cpu_alias(AliasPool& pool, const at::Tensor& t, c10::Storage& storage, bool inference) {
  const c10::TensorImpl* src = t.unsafeGetTensorImpl();
  // A TensorImpl's autograd keys follow inference mode at its creation: a
  // pooled one is used only in the mode it was made in, as a new one would be.
  if (pool.empty() || pool.back()->is_inference() != inference) {
    if (!storage) storage = alias_storage(src->unsafe_storage());
    return cpu_alias(t, storage);
  }
  // Only AliasImpls enter the pool (recycle_cpu_alias).
  auto impl = c10::intrusive_ptr<AliasImpl>::reclaim(static_cast<AliasImpl*>(pool.back().release()));
  pool.pop_back();
  if (!storage) {
    const c10::Storage& npu = src->unsafe_storage();
    c10::StorageImpl* own = impl->unsafe_storage().unsafeGetStorageImpl();
    own->set_data_ptr_noswap(
        c10::DataPtr(const_cast<void*>(npu.data()), nullptr, &noop_delete, c10::Device(c10::DeviceType::CPU)));
    own->set_nbytes(npu.sym_nbytes());
    storage = impl->unsafe_storage();
  }
  impl->take_storage(storage, t.dtype());
  take_geometry_and_flags(impl.get(), src);
  return as_tensor(std::move(impl));
}

void recycle_cpu_alias(AliasPool& pool, at::Tensor&& alias) {
  if (!alias.defined() || pool.size() >= kAliasPoolSize) return;
  // Only what nothing else holds or changed: the one reference, no weak
  // ones, no Python key, and its own storage still the plain alias of
  // device memory (not resized or replaced by the kernel).
  c10::TensorImpl* impl = alias.unsafeGetTensorImpl();
  if (alias.use_count() != 1 || alias.weak_use_count() != 1) return;
  if (typeid(*impl) != typeid(AliasImpl) || impl->key_set().has(c10::DispatchKey::Python) ||
      !impl->allow_tensor_metadata_change() ||
      !impl->has_storage() || impl->device_type() != c10::DeviceType::CPU) {
    return;
  }
  c10::StorageImpl* s = impl->unsafe_storage().unsafeGetStorageImpl();
  if (impl->unsafe_storage().use_count() != 1 || s->data_ptr().get_deleter() != &noop_delete ||
      s->allocator() != &g_redirect || !s->resizable()) {
    return;
  }
  pool.push_back(alias.unsafeReleaseIntrusivePtr());
}

at::Tensor cpu_alias(const at::Tensor& t) {
  return cpu_alias(t, alias_storage(t.unsafeGetTensorImpl()->unsafe_storage()));
}

c10::Storage adopt_storage(c10::StorageImpl* s, int device) {
  const c10::Device npu(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device));
  if (s->data_ptr().get_deleter() == allocator::deleter()) {
    c10::DataPtr dp = s->set_data_ptr(
        c10::DataPtr(nullptr, nullptr, &noop_delete, c10::Device(c10::DeviceType::CPU)));
    dp.unsafe_set_device(npu);
    return c10::Storage(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), s->sym_nbytes(),
                                                              std::move(dp), allocator::get(), true));
  }
  auto nbytes = s->nbytes();
  if (s->data() == nullptr) {
    // No memory behind it (e.g. an efficient zero tensor): nothing to move.
    return c10::Storage(c10::make_intrusive<c10::StorageImpl>(
        c10::StorageImpl::use_byte_size_t(), nbytes, c10::DataPtr(nullptr, npu), allocator::get(device), false));
  }
  // Memory the kernel did not take from the pool (a static buffer, or an
  // allocation on an intra-op worker thread): copy it into device memory.
  c10::DataPtr dp = allocator::allocate(nbytes, device, npu);
  if (nbytes) std::memcpy(dp.get(), s->data(), nbytes);
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), nbytes,
                                                            std::move(dp), allocator::get(), true));
}

at::Tensor npu_tensor_like(c10::Storage storage, const at::Tensor& geometry) {
  auto out = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), geometry.dtype());
  c10::TensorImpl* o = out.unsafeGetTensorImpl();
  const c10::TensorImpl* g = geometry.unsafeGetTensorImpl();
  o->set_sizes_and_strides(g->sizes(), g->strides(), g->storage_offset());
  if (g->is_conj()) o->_set_conj(true);
  if (g->is_neg()) o->_set_neg(true);
  if (g->_is_zerotensor()) o->_set_zero(true);
  return out;
}

namespace {
void release_storage_ref(void* ctx) { c10::raw::intrusive_ptr::decref(static_cast<c10::StorageImpl*>(ctx)); }
}  // namespace

at::Tensor share_result(const at::Tensor& r, int device) {
  if (!r.defined()) return r;
  c10::StorageImpl* s = r.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl();
  if (s->data_ptr().get_deleter() != allocator::deleter()) return adopt_result(r, device);
  const c10::Device npu(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device));
  c10::raw::intrusive_ptr::incref(s);
  c10::DataPtr dp(const_cast<void*>(s->data()), s, &release_storage_ref, npu);
  return npu_tensor_like(c10::Storage(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(),
                                                                            s->sym_nbytes(), std::move(dp),
                                                                            allocator::get(), false)),
                         r);
}

at::Tensor adopt_result_in_place(at::Tensor r, int device) {
  if (!r.defined()) return r;
  c10::TensorImpl* impl = r.unsafeGetTensorImpl();
  // Only a plain, fresh, unshared CPU result: then turning its TensorImpl
  // into the npu tensor is what a new one would be (same sizes, strides,
  // dtype, flags; the backend bits of its key set and its device change).
  const bool plain = r.use_count() == 1 && r.weak_use_count() <= 1 && impl->device_type() == c10::DeviceType::CPU &&
                     impl->layout() == c10::kStrided && !impl->is_conj() && !impl->is_neg() &&
                     !impl->_is_zerotensor() && !impl->is_wrapped_number() &&
                     !impl->key_set().has(c10::DispatchKey::Python) &&
                     impl->allow_tensor_metadata_change() && impl->has_storage();
  if (!plain) return adopt_result(r, device);
  c10::StorageImpl* s = impl->unsafe_storage().unsafeGetStorageImpl();
  if (impl->unsafe_storage().use_count() == 1 && s->data_ptr().get_deleter() == allocator::deleter()) {
    // Its storage is its own and pool memory: relabelled in place too (what
    // adopt_storage would build: the same DataPtr on the npu, the pool's
    // allocator, resizable), and the TensorImpl takes the storage's device.
    s->_mutable_data_ptr_no_checks().unsafe_set_device(
        c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device)));
    s->set_allocator(allocator::get());
    s->set_resizable(true);
    impl->set_storage_keep_dtype(impl->storage());
  } else {
    impl->set_storage_keep_dtype(adopt_storage(s, device));
  }
  impl->_change_backend_component_keys(c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device)));
  return r;
}

at::Tensor adopt_result(const at::Tensor& r, int device) {
  if (!r.defined()) return r;
  return npu_tensor_like(adopt_storage(r.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl(), device), r);
}

}  // namespace torch_npu::exec
