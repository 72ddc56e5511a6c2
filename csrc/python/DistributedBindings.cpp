// torch_npu._C._distributed_c10d: the Python face of ProcessGroupHCCL.
#include <torch/csrc/utils/pybind.h>
#include <pybind11/chrono.h>
#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "distributed/ProcessGroupHCCL.h"

namespace py = pybind11;

namespace {

// Holder that drops its reference without the GIL: destroying a backend
// joins Gloo's threads, which may need the GIL to finish Python callbacks.
// Same layout as c10::intrusive_ptr, as torch's own Backend holder.
template <typename T>
class NoGilHolder {
 public:
  NoGilHolder() = default;
  NoGilHolder(const NoGilHolder&) = default;
  NoGilHolder(NoGilHolder&&) noexcept = default;
  NoGilHolder& operator=(const NoGilHolder&) = default;
  NoGilHolder& operator=(NoGilHolder&&) noexcept = default;
  explicit NoGilHolder(c10::intrusive_ptr<T> impl) : impl_(std::move(impl)) {}
  explicit NoGilHolder(T* impl) : impl_(c10::intrusive_ptr<T>::unsafe_steal_from_new(impl)) {}
  ~NoGilHolder() {
    if (impl_) {
      if (PyGILState_Check()) {
        py::gil_scoped_release release;
        impl_.reset();
      } else {
        impl_.reset();
      }
    }
  }
  T& operator*() const noexcept { return *impl_; }
  T* operator->() const noexcept { return impl_.get(); }
  T* get() const noexcept { return impl_.get(); }
  void reset() noexcept { impl_.reset(); }
  operator bool() const noexcept { return impl_; }

 private:
  c10::intrusive_ptr<T> impl_;
};

}  // namespace

PYBIND11_DECLARE_HOLDER_TYPE(T, NoGilHolder<T>, true)

namespace torch_npu::distributed {

void init_distributed_bindings(py::module& parent) {
  using PG = ProcessGroupHCCL;
  py::module m = parent.def_submodule("_distributed_c10d", "torch_npu's c10d backends (emulated HCCL)");
  py::module::import("torch.distributed");  // registers c10d's Backend/Store types

  m.def("_set_gloo_factory", [](py::function fn) {
    // Deliberately leaked: the factory lives until exit, and a Python object
    // must not be released by a static destructor after Python finalized.
    auto* shared = new py::function(std::move(fn));
    set_gloo_factory([shared](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                              std::chrono::milliseconds timeout) {
      py::gil_scoped_acquire gil;
      py::object backend = (*shared)(store, rank, size, timeout);
      return backend.cast<c10::intrusive_ptr<c10d::Backend>>();
    });
  });

  auto pg = py::class_<PG, c10d::Backend, NoGilHolder<PG>>(m, "ProcessGroupHCCL")
                .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                 c10::intrusive_ptr<PG::Options> options) {
                       return NoGilHolder<PG>(c10::make_intrusive<PG>(store, rank, size, std::move(options)));
                     }),
                     py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("options"),
                     py::call_guard<py::gil_scoped_release>())
                .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                 std::chrono::milliseconds timeout) {
                       auto options = c10::make_intrusive<PG::Options>();
                       options->timeout = timeout;
                       return NoGilHolder<PG>(c10::make_intrusive<PG>(store, rank, size, options));
                     }),
                     py::arg("store"), py::arg("rank"), py::arg("size"),
                     py::arg("timeout") = std::chrono::milliseconds(30 * 60 * 1000),
                     py::call_guard<py::gil_scoped_release>())
                .def_property_readonly("options", &PG::options)
                .def_property("_collective_check", &PG::collective_check, &PG::set_collective_check)
                .def_property_readonly("_fingerprint_count", &PG::fingerprints)
                .def_property_readonly("_gloo", &PG::gloo)
                // The communicator's name is the c10d group name: it is what
                // the comm-fused ops (hcom=...) resolve back to a group.
                .def("get_hccl_comm_name",
                     [](PG& self, int64_t rankid, bool init_comm) { return self.getGroupUid(); },
                     py::arg("rankid"), py::kw_only(), py::arg("init_comm") = true)
                .def("get_hccl_comm", [](PG& self, int64_t rank) { return self.getID(); }, py::arg("rank"))
                .def("_set_hccl_comm_name", [](PG& self, const std::string& name) {
                  TORCH_CHECK(self.getGroupUid().empty() || self.getGroupUid() == name,
                              "The hccl comm name of a group cannot be changed once set (", self.getGroupUid(),
                              ")");
                  self.setGroupUid(name);
                })
                // c10d calls this on ranks left out of a new_group when the default
                // group is bound to a device (NCCL must split on every rank); the
                // Gloo meshes here are built by the members alone.
                .def("perform_nocolor_split", [](PG&, at::Device) {}, py::arg("device"))
                // Joins the group's Gloo threads: without the GIL, which they may need.
                .def("shutdown", &PG::shutdown, py::call_guard<py::gil_scoped_release>())
                .def("abort_hccl_comm", [](PG& self) { self.abort(); })
                .def("resume_hccl_comm", [](PG& self, int64_t device_id) {}, py::arg("device_id"))
                .def("get_coll_stream_id", [](PG&) { return 0; })
                .def("_get_stream_id", [](PG&, bool is_p2p, int64_t peer) { return 0; },
                     py::arg("is_p2p") = false, py::arg("peer") = -1)
                .def("_delete_tcpstore_key", [](PG&) { return true; })
                .def("_set_switch_nic_comm", [](PG&, int64_t, const std::vector<int64_t>&,
                                                const std::vector<bool>&) { return true; })
                .def("set_watchdog_status", [](PG&, int64_t) {})
                .def("clear_workmeta_list", [](PG&) {})
                .def("_group_start", [](PG& self) { self.startCoalescing(); })
                .def("_group_end", [](PG& self) { self.endCoalescing(); });

  py::class_<PG::Options, c10d::Backend::Options, NoGilHolder<PG::Options>>(pg, "Options")
      .def(py::init([](bool is_high_priority_stream) {
             return NoGilHolder<PG::Options>(c10::make_intrusive<PG::Options>(is_high_priority_stream));
           }),
           py::arg("is_high_priority_stream") = false)
      .def_readwrite("is_high_priority_stream", &PG::Options::is_high_priority_stream)
      .def_readwrite("group_id", &PG::Options::group_id)
      .def_readwrite("hccl_config", &PG::Options::hccl_config)
      .def_readwrite("op_timeout", &PG::Options::op_timeout)
      .def("__copy__", [](const PG::Options& self) {
        auto copy = c10::make_intrusive<PG::Options>(self.is_high_priority_stream);
        copy->timeout = self.timeout;
        copy->group_name = self.group_name;
        copy->global_ranks_in_group = self.global_ranks_in_group;
        copy->group_id = self.group_id;
        copy->hccl_config = self.hccl_config;
        copy->op_timeout = self.op_timeout;
        return NoGilHolder<PG::Options>(copy);
      })
      .def("__deepcopy__", [](py::object self, py::dict) { return self.attr("__copy__")(); });
}

}  // namespace torch_npu::distributed
