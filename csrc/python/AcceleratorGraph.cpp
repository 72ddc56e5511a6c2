// torch.accelerator.Graph for npu: PyTorch's generic graph API creates its
// backend object from at::GraphImplRegistry under the device type's name
// ("NPU" once PrivateUse1 is renamed). Graph capture on the emulated device
// is torch_npu.npu.graphs.NPUGraph (Python, a dispatch-mode recorder), so the
// registered implementation forwards every call to one NPUGraph instance.
#include <ATen/core/GraphImplInterface.h>
#include <torch/csrc/utils/pybind.h>

#include <memory>
#include <string>

namespace py = pybind11;

namespace torch_npu {
namespace {

const char* capture_mode_name(at::GraphCaptureMode mode) {
  switch (mode) {
    case at::GraphCaptureMode::ThreadLocal:
      return "thread_local";
    case at::GraphCaptureMode::Relaxed:
      return "relaxed";
    case at::GraphCaptureMode::Global:
    case at::GraphCaptureMode::Default:
    default:
      return "global";  // NPUGraph's own default
  }
}

class NPUAcceleratorGraph final : public at::GraphImplInterface {
 public:
  explicit NPUAcceleratorGraph(at::GraphImplArgs args) {
    py::gil_scoped_acquire gil;
    graph_ = std::make_unique<py::object>(
        py::module_::import("torch_npu.npu.graphs").attr("NPUGraph")(args.keep_graph));
  }

  ~NPUAcceleratorGraph() override {
    // The Python object may outlive the interpreter only if Python is gone;
    // then it is leaked rather than released without the GIL.
    if (!Py_IsInitialized()) {
      (void)graph_.release();
      return;
    }
    py::gil_scoped_acquire gil;
    graph_.reset();
  }

  void capture_begin(at::MempoolId_t pool, at::GraphCaptureMode capture_mode) override {
    py::gil_scoped_acquire gil;
    py::object pool_arg = py::none();
    if (pool.first != 0 || pool.second != 0) pool_arg = py::make_tuple(pool.first, pool.second);
    call("capture_begin", pool_arg, capture_mode_name(capture_mode));
  }
  void capture_end() override { call0("capture_end"); }
  void instantiate() override {}  // capture_end leaves a replayable graph
  void replay() override { call0("replay"); }
  void reset() override { call0("reset"); }
  at::MempoolId_t pool() const override {
    py::gil_scoped_acquire gil;
    auto t = graph_->attr("pool")().cast<py::tuple>();
    return {t[0].cast<c10::CaptureId_t>(), t[1].cast<c10::CaptureId_t>()};
  }
  void enable_debug_mode() override { call0("enable_debug_mode"); }
  void debug_dump(const std::string& path) override {
    py::gil_scoped_acquire gil;
    call("debug_dump", path);
  }

 private:
  // Python exceptions propagate as py::error_already_set, which the binding
  // layer turns back into the original Python exception.
  template <typename... Args>
  void call(const char* name, Args&&... args) {
    graph_->attr(name)(std::forward<Args>(args)...);
  }
  void call0(const char* name) {
    py::gil_scoped_acquire gil;
    graph_->attr(name)();
  }

  std::unique_ptr<py::object> graph_;
};

}  // namespace
}  // namespace torch_npu

// The registry macro names at::GraphImplRegistry unqualified.
namespace at {
REGISTER_GRAPH_IMPL(NPU, torch_npu::NPUAcceleratorGraph);
}  // namespace at
