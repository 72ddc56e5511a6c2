// torch_npu._C's trace-hook calls: _activate_npu_trace(mode) connects the
// core's hooks (core/NPUTrace.h) to one Python dispatcher,
// torch_npu.utils._npu_trace._fire(kind, *args), which fires the registry of
// that kind.
#include <torch/csrc/utils/pybind.h>

#include <string>

#include "aten/OpExecution.h"
#include "core/NPUCachingAllocator.h"
#include "core/NPUTrace.h"

namespace py = pybind11;

namespace torch_npu::trace_bindings {
namespace {

// Leaked on purpose: hooks can fire while the interpreter shuts down.
py::object* g_dispatch = nullptr;

bool python_alive() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsInitialized() && !Py_IsFinalizing();
#else
  return Py_IsInitialized() && !_Py_IsFinalizing();
#endif
}

// Reports made from destructors: their callbacks' failures cannot propagate.
bool from_destructor(trace::Kind kind) {
  return kind == trace::Kind::MemoryDeallocation || kind == trace::Kind::EventDeletion ||
         kind == trace::Kind::AclFinishExecution;
}

// The core's sink: may run on any thread, with or without the GIL. A
// callback's exception propagates to the operation that fired it (pybind11 and
// torch's bindings turn it back into the Python exception), except from a
// destructor, where it goes to sys.unraisablehook.
void python_sink(trace::Kind kind, const std::string* name, int nargs, uint64_t a, uint64_t b) {
  if (!python_alive()) return;
  py::gil_scoped_acquire gil;
  if (g_dispatch == nullptr) return;
  try {
    const int k = static_cast<int>(kind);
    if (name != nullptr) {
      (*g_dispatch)(k, *name);
    } else if (nargs == 0) {
      (*g_dispatch)(k);
    } else if (nargs == 1) {
      (*g_dispatch)(k, a);
    } else {
      (*g_dispatch)(k, a, b);
    }
  } catch (py::error_already_set& e) {
    if (!from_destructor(kind)) throw;
    e.discard_as_unraisable("torch_npu.utils._npu_trace callback");
  }
}

}  // namespace

void init_trace_bindings(py::module& m) {
  m.def(
      "_activate_npu_trace",
      [](int mode) {
        if (g_dispatch == nullptr) {
          g_dispatch = new py::object(py::module::import("torch_npu.utils._npu_trace").attr("_fire"));
          trace::set_sink(&python_sink);
        }
        trace::activate(mode);  // raises on an unknown mode
        if (mode == trace::kKernelMode) exec::enable_kernel_trace(true);
      },
      py::arg("mode"));
  // Emulator extra (tests, the sanitizer's disable): every hook off again.
  m.def("_deactivate_npu_trace", [] {
    trace::deactivate();
    exec::enable_kernel_trace(false);
  });
  m.def("_npu_trace_active_mask", [] { return trace::active_mask(); });
  // The allocation stream of a block in use (-1: not a caching-allocator block in use).
  m.def("_npu_block_stream", [](uint64_t ptr) {
    return allocator::stream_of(reinterpret_cast<const void*>(static_cast<uintptr_t>(ptr)));
  });
}

}  // namespace torch_npu::trace_bindings
