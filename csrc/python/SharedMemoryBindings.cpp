// torch_npu._C's shared-memory storage calls, used by
// torch_npu.multiprocessing: move an npu storage into shared device memory,
// report its handle, and map a handle received from another process.
#include <torch/csrc/utils/pybind.h>

#include <ATen/core/Tensor.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/TensorImpl.h>

#include <cstring>

#include "core/NPUCachingAllocator.h"
#include "core/NPUException.h"

namespace py = pybind11;

namespace torch_npu::shared_memory {
namespace {

c10::StorageImpl* npu_storage_of(const at::Tensor& t) {
  TORCH_CHECK(t.device().is_privateuseone(), "expected an npu tensor, got one on ", t.device(),
              PTA_ERROR(ErrCode::PARAM));
  return t.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl();
}

// Moves the storage's bytes into shared device memory (no-op if they are
// there already) and returns the handle. Like a CPU storage in shared
// memory, the storage can no longer be resized.
int share_storage(const at::Tensor& t) {
  c10::StorageImpl* s = npu_storage_of(t);
  int handle = allocator::shared_handle(s->data_ptr());
  if (handle >= 0) return handle;
  const size_t nbytes = s->nbytes();
  const int device = t.device().index();
  c10::DataPtr shared = allocator::allocate_shared(nbytes, device);
  if (nbytes > 0) std::memcpy(shared.get(), s->data(), nbytes);
  handle = allocator::shared_handle(shared);
  s->set_data_ptr_noswap(std::move(shared));
  s->set_resizable(false);
  return handle;
}

int storage_handle(const at::Tensor& t) { return allocator::shared_handle(npu_storage_of(t)->data_ptr()); }

// A 1-D uint8 npu tensor over the shared memory behind `handle` (which it
// takes ownership of).
at::Tensor import_storage(int handle, int64_t nbytes, int device) {
  c10::DataPtr dp = allocator::import_shared(handle, static_cast<size_t>(nbytes), device);
  c10::Storage storage(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), nbytes,
                                                             std::move(dp), nullptr, /*resizable=*/false));
  auto t = at::detail::make_tensor<c10::TensorImpl>(std::move(storage),
                                                    c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                                    caffe2::TypeMeta::Make<uint8_t>());
  t.unsafeGetTensorImpl()->set_sizes_contiguous({nbytes});
  return t;
}

}  // namespace

void init_shared_memory_bindings(py::module& m) {
  m.def("_npu_share_storage", &share_storage, py::call_guard<py::gil_scoped_release>());
  m.def("_npu_storage_shared_handle", &storage_handle);
  m.def("_npu_import_shared_storage", &import_storage);
}

}  // namespace torch_npu::shared_memory
