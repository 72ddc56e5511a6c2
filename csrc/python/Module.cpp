// torch_npu._C: the Python face of the C++ core. This is the only
// translation unit that includes Python/pybind11 headers.
#include <torch/csrc/Generator.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/utils/device_lazy_init.h>
#include <torch/csrc/utils/pybind.h>
#include <pybind11/stl.h>

#include <climits>
#include <map>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/ones.h>
#include <c10/core/Allocator.h>

#include "aten/ChipNumericsKernels.h"
#include "aten/CubeInputRounding.h"
#include "aten/EmulatedCpuFallback.h"
#include "aten/FusionAttentionSdpa.h"
#include "aten/OpExecution.h"
#include "core/EmuLog.h"
#include "core/NPUCachingAllocator.h"
#include "core/NPUException.h"
#include "core/Settings.h"
#include "core/NPUGenerator.h"
#include "core/NPUGuard.h"
#include "profiler/DeviceTimeline.h"
#include "runtime/AclRuntime.h"

namespace py = pybind11;

namespace torch_npu {
void register_hooks();
namespace profiler {
void register_profiler_stubs();
}
namespace distributed {
void init_distributed_bindings(pybind11::module& parent);
}
namespace format {
void register_serialization();
}
namespace shared_memory {
void init_shared_memory_bindings(pybind11::module& m);  // torch.multiprocessing support
}
namespace trace_bindings {
void init_trace_bindings(pybind11::module& m);  // _activate_npu_trace
}
}  // namespace torch_npu

namespace {

struct DeviceProperties {
  std::string name;
  uint64_t total_memory;
  int cube_core_num = 24;
  int vector_core_num = 48;
  int64_t L2_cache_size = 192LL << 20;
  int major = 0, minor = 0;
  int is_multi_gpu_board = 0, is_integrated = 0;
  int multi_processor_count = 24;
  int max_threads_per_multi_processor = 0, warp_size = 0, regs_per_multiprocessor = 0;
  std::string gcnArchName;
  std::string uuid;
};

int checked_device(int64_t d) {
  NPU_CHECK_ERROR(acl_emu::aclrtCheckDevice(static_cast<int32_t>(d)));
  return static_cast<int>(d);
}

py::dict stat_dict(const torch_npu::allocator::Stat& s) {
  py::dict d;
  d["current"] = s.current;
  d["peak"] = s.peak;
  d["allocated"] = s.allocated;
  d["freed"] = s.freed;
  return d;
}

py::dict stat_array(const torch_npu::allocator::StatArray& arr) {
  static const char* names[] = {"all", "small_pool", "large_pool"};
  py::dict d;
  for (int i = 0; i < torch_npu::allocator::NUM_STAT_TYPES; ++i) d[names[i]] = stat_dict(arr[i]);
  return d;
}

py::dict memory_stats(int64_t device) {
  auto s = torch_npu::allocator::stats(checked_device(device));
  py::dict r;
  r["num_alloc_retries"] = s.num_alloc_retries;
  r["num_ooms"] = s.num_ooms;
  r["num_sync_all_streams"] = s.num_sync_all_streams;
  r["num_device_alloc"] = s.num_device_alloc;
  r["num_device_free"] = s.num_device_free;
  r["max_split_size"] = s.max_split_size;
  r["allocation"] = stat_array(s.allocation);
  r["segment"] = stat_array(s.segment);
  r["active"] = stat_array(s.active);
  r["inactive_split"] = stat_array(s.inactive_split);
  r["allocated_bytes"] = stat_array(s.allocated_bytes);
  r["reserved_bytes"] = stat_array(s.reserved_bytes);
  r["active_bytes"] = stat_array(s.active_bytes);
  r["inactive_split_bytes"] = stat_array(s.inactive_split_bytes);
  r["requested_bytes"] = stat_array(s.requested_bytes);
  r["oversize_allocations"] = stat_dict(s.oversize_allocations);
  r["oversize_segments"] = stat_dict(s.oversize_segments);
  return r;
}

py::dict memory_snapshot() {
  py::list segments;
  for (const auto& seg : torch_npu::allocator::snapshot()) {
    py::dict d;
    d["device"] = seg.device;
    d["address"] = seg.address;
    d["total_size"] = seg.total_size;
    d["allocated_size"] = seg.allocated_size;
    d["active_size"] = seg.active_size;
    d["requested_size"] = seg.requested_size;
    d["stream"] = seg.stream;
    d["segment_type"] = seg.is_large ? "large" : "small";
    d["segment_pool_id"] = py::make_tuple(0, 0);
    d["is_expandable"] = false;
    d["frames"] = py::list();
    py::list blocks;
    for (const auto& b : seg.blocks) {
      py::dict bd;
      bd["address"] = b.address;
      bd["size"] = b.size;
      bd["requested_size"] = b.requested_size;
      // CUDA's states; a freed block waiting for record_stream'd streams is pending.
      bd["state"] = b.allocated ? "active_allocated" : (b.pending ? "active_pending_free" : "inactive");
      bd["frames"] = py::list();
      blocks.append(bd);
    }
    d["blocks"] = blocks;
    segments.append(d);
  }
  py::dict r;
  r["segments"] = segments;
  r["device_traces"] = py::list();
  return r;
}

// Python context manager over exec::DeviceMemoryScope (thread-local; enter
// and exit on the same thread).
struct MemoryScopeContext {
  int device;
  std::unique_ptr<torch_npu::exec::DeviceMemoryScope> scope;
  void enter() {
    TORCH_CHECK(!scope, "_DeviceMemoryScope is already entered");
    scope = std::make_unique<torch_npu::exec::DeviceMemoryScope>(device);
  }
  void exit() { scope.reset(); }
};

// A kernel run from Python (the chip-numerics kernels): device memory scope
// plus the kernel observers (device timeline), as NPU_KERNEL_SCOPE gives C++.
struct KernelScopeContext {
  c10::OperatorHandle op;
  int device;
  std::unique_ptr<torch_npu::exec::KernelScope> scope;
  void enter() {
    TORCH_CHECK(!scope, "_NpuKernelScope is already entered");
    scope = std::make_unique<torch_npu::exec::KernelScope>(op, device);
  }
  void exit() { scope.reset(); }
};

// The Python logging sink of the C++ core (torch_npu.utils._logging).
py::function* g_log_sink = nullptr;  // leaked: used until exit

void python_log_sink(torch_npu::log::Component component, int level, const std::string& message) {
  if (!Py_IsInitialized() || g_log_sink == nullptr) return;
  py::gil_scoped_acquire gil;
  try {
    (*g_log_sink)(torch_npu::log::component_name(component), level, message);
  } catch (py::error_already_set& e) {
    e.discard_as_unraisable("torch_npu log sink");
  }
}

py::tuple stream_tuple(const c10::Stream& s) {
  return py::make_tuple(s.id(), static_cast<int>(s.device_index()), static_cast<int>(s.device_type()));
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "torch_npu C++ core (emulated Ascend NPU)";
  torch_npu::distributed::init_distributed_bindings(m);
  torch_npu::shared_memory::init_shared_memory_bindings(m);
  torch_npu::trace_bindings::init_trace_bindings(m);

  // Done at import: before any npu op can run, the CPU allocator must be
  // redirectable and the explicit CPU kernels registered.
  m.def("_initExtension", [](const std::vector<std::string>& native_ops) {
    torch_npu::exec::install_cpu_allocator();
    torch_npu::register_hooks();
    torch_npu::profiler::register_profiler_stubs();
    torch_npu::format::register_serialization();
    c10::SetAllocator(c10::DeviceType::PrivateUse1, torch_npu::allocator::get());
    auto r = torch_npu::exec::register_explicit_cpu_kernels(
        std::unordered_set<std::string>(native_ops.begin(), native_ops.end()));
    py::dict d;
    d["zero_copy_explicit"] = r.zero_copy_explicit;
    d["emulated_fallback"] = r.emulated_fallback;
    d["unboxed"] = r.unboxed;
    return d;
  });
  m.def("_emu_fallback_report", [] {
    py::list out;
    for (const auto& [name, s] : torch_npu::exec::fallback_stats()) {
      py::dict d;
      d["op"] = name;
      d["calls"] = s.calls;
      d["bytes_to_cpu"] = s.bytes_to_cpu;
      d["bytes_to_npu"] = s.bytes_to_npu;
      d["ns"] = s.ns;
      out.append(d);
    }
    return out;
  });
  m.def("_emu_reset_fallback_report", [] { torch_npu::exec::reset_fallback_stats(); });
  m.def("_npu_init", [] { torch_npu::allocator::init(); });
  // At exit: run one tiny C++-only backward per device. Each autograd
  // device thread then drops its reference to the user's last GraphTask
  // (whose outputs are Python objects) before Python finalizes; the task it
  // holds afterwards owns no Python object, so releasing it late is safe.
  m.def("_npu_flush_autograd_threads", [] {
    py::gil_scoped_release no_gil;
    uint32_t n = 0;
    acl_emu::aclrtGetDeviceCount(&n);
    for (uint32_t d = 0; d < n; ++d) {
      at::Tensor leaf = at::ones({1}, at::TensorOptions().device(c10::Device(
                                          c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(d))));
      leaf.set_requires_grad(true);
      torch::autograd::backward({leaf.sum()});
    }
  });
  m.def("_npu_getDeviceCount", [] {
    uint32_t n = 0;
    acl_emu::aclrtGetDeviceCount(&n);
    return static_cast<int>(n);
  });
  m.def("_npu_setDevice", [](int64_t d) { NPU_CHECK_ERROR(acl_emu::aclrtSetDevice(static_cast<int32_t>(d))); });
  m.def("_npu_getDevice", [] { return acl_emu::current_device_or_default(); });
  m.def("_npu_synchronize", [] { torch_npu::synchronize_device(acl_emu::current_device_or_default()); });
  m.def("_npu_eraseStream", [](const at::Tensor& t, int64_t stream_id, int64_t device_index) {
    torch_npu::allocator::erase_stream(
        t.storage().data_ptr(),
        c10::Stream(c10::Stream::UNSAFE,
                    c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device_index)),
                    stream_id));
  });
  // After fork: the next npu use (factories included) must go through
  // torch.npu._lazy_init(), which raises the fork error.
  m.def("_npu_set_run_yet_variable_to_false",
        [] { torch::utils::set_requires_device_init(c10::DeviceType::PrivateUse1, true); });
  m.def("_npu_canDeviceAccessPeer", [](int64_t a, int64_t b) {
    checked_device(a);
    checked_device(b);
    return true;
  });

  py::class_<DeviceProperties>(m, "_NPUDeviceProperties")
      .def_readonly("name", &DeviceProperties::name)
      .def_readonly("total_memory", &DeviceProperties::total_memory)
      .def_readonly("cube_core_num", &DeviceProperties::cube_core_num)
      .def_readonly("vector_core_num", &DeviceProperties::vector_core_num)
      .def_readonly("L2_cache_size", &DeviceProperties::L2_cache_size)
      .def_readonly("major", &DeviceProperties::major)
      .def_readonly("minor", &DeviceProperties::minor)
      .def_readonly("is_multi_gpu_board", &DeviceProperties::is_multi_gpu_board)
      .def_readonly("is_integrated", &DeviceProperties::is_integrated)
      .def_readonly("multi_processor_count", &DeviceProperties::multi_processor_count)
      .def_readonly("max_threads_per_multi_processor", &DeviceProperties::max_threads_per_multi_processor)
      .def_readonly("warp_size", &DeviceProperties::warp_size)
      .def_readonly("regs_per_multiprocessor", &DeviceProperties::regs_per_multiprocessor)
      .def_readonly("gcnArchName", &DeviceProperties::gcnArchName)
      .def_readonly("uuid", &DeviceProperties::uuid)
      .def("__repr__", [](const DeviceProperties& p) {
        std::ostringstream os;
        os << "_NPUDeviceProperties(name='" << p.name << "', total_memory=" << p.total_memory / (1024.0 * 1024.0)
           << "MB, cube_core_num=" << p.cube_core_num << ", vector_core_num=" << p.vector_core_num
           << ", uuid=" << p.uuid << ", L2_cache_size=" << p.L2_cache_size / (1024.0 * 1024.0) << "MB)";
        return os.str();
      });
  m.def("_npu_getDeviceProperties", [](int64_t d) {
    int dev = checked_device(d);
    const auto& cfg = acl_emu::config();
    DeviceProperties p;
    p.name = cfg.name;
    p.total_memory = cfg.capacity;
    char buf[64];
    // A stable, well-formed uuid per physical device (version-4 layout).
    std::snprintf(buf, sizeof(buf), "a5c3e0d2-0e7a-4e50-8000-%012x", cfg.visible[dev]);
    p.uuid = buf;
    return p;
  });

  // memory
  m.def("_npu_memoryStats", &memory_stats);
  m.def("_npu_resetAccumulatedMemoryStats",
        [](int64_t d) { torch_npu::allocator::reset_accumulated_stats(checked_device(d)); });
  m.def("_npu_resetPeakMemoryStats", [](int64_t d) { torch_npu::allocator::reset_peak_stats(checked_device(d)); });
  m.def("_npu_emptyCache", [] { torch_npu::allocator::empty_cache(); });
  m.def("_npu_memorySnapshot", &memory_snapshot);
  m.def("_npu_setMemoryFraction",
        [](double f, int64_t d) { torch_npu::allocator::set_memory_fraction(f, checked_device(d)); });
  m.def("_npu_getMemoryFraction",
        [](int64_t d) { return torch_npu::allocator::get_memory_fraction(checked_device(d)); });
  m.def("_npu_getMemInfo", [](int64_t d) {
    auto r = torch_npu::allocator::mem_get_info(checked_device(d));
    return py::make_tuple(r.first, r.second);
  });
  m.def("_npu_cachingAllocator_raw_alloc", [](int64_t size, int64_t d) {
    return reinterpret_cast<int64_t>(torch_npu::allocator::raw_alloc(static_cast<size_t>(size), checked_device(d)));
  });
  m.def("_npu_cachingAllocator_raw_delete",
        [](int64_t ptr) { torch_npu::allocator::raw_delete(reinterpret_cast<void*>(ptr)); });
  m.def("_npu_allocatorConfig", [] { return torch_npu::allocator::config_string(); });

  // streams
  m.def("_npu_getCurrentStream", [](int64_t d) { return stream_tuple(torch_npu::current_stream(checked_device(d))); });
  m.def("_npu_getDefaultStream", [](int64_t d) {
    return py::make_tuple(0, checked_device(d), static_cast<int>(c10::DeviceType::PrivateUse1));
  });
  m.def("_npu_setStream", [](int64_t stream_id, int64_t device_index, int64_t device_type) {
    TORCH_CHECK(device_type == static_cast<int64_t>(c10::DeviceType::PrivateUse1), "Expected a npu stream");
    // As torch_npu (and CUDA): selecting a stream makes its device current.
    if (acl_emu::current_device_or_default() != device_index) {
      NPU_CHECK_ERROR(acl_emu::aclrtSetDevice(static_cast<int32_t>(device_index)));
    }
    torch_npu::set_current_stream(c10::Stream(c10::Stream::UNSAFE,
                                              c10::Device(c10::DeviceType::PrivateUse1,
                                                          static_cast<c10::DeviceIndex>(checked_device(device_index))),
                                              stream_id));
  });

  // random
  m.def("_npu_getDefaultGenerators", [] {
    py::list out;
    uint32_t n = 0;
    acl_emu::aclrtGetDeviceCount(&n);
    for (uint32_t i = 0; i < n; ++i) {
      const at::Generator& g = torch_npu::default_generator(static_cast<c10::DeviceIndex>(i));
      out.append(py::reinterpret_steal<py::object>(THPGenerator_initDefaultGenerator(g)));
    }
    return out;
  });

  // emulator facts (torch_npu.emulator)
  m.def("_emu_config", [] {
    const auto& c = acl_emu::config();
    py::dict d;
    d["physical_device_count"] = c.physical_count;
    d["device_count"] = static_cast<int>(c.visible.size());
    d["device_name"] = c.name;
    d["memory_per_device"] = c.capacity;
    d["visible_devices"] = c.visible;
    return d;
  });
  // torch_npu._settings hands the core its validated settings (the core reads no environment).
  m.def("_set_core_settings", [](std::map<std::string, std::string> values, bool interactive) {
    torch_npu::settings::set_all(std::move(values), interactive);
  });
  m.def("_emu_driver_used_bytes", [](int64_t d) { return acl_emu::driver_used_bytes(checked_device(d)); });
  m.def("_format_error_code", [](int sub, int code) {
    return torch_npu::format_error_code(static_cast<torch_npu::SubModule>(sub), static_cast<torch_npu::ErrCode>(code));
  });
  // private formats (torch_npu.npu_format_cast & co.): a tag on the storage
  m.def("_npu_storage_format", [](const at::Tensor& t) {
    const void* data = t.unsafeGetTensorImpl()->unsafe_storage().data();
    return (data && t.device().is_privateuseone()) ? torch_npu::allocator::storage_format(data) : -1;
  });
  m.def("_npu_set_storage_format", [](const at::Tensor& t, int format) {
    TORCH_CHECK(t.device().is_privateuseone(), "npu_format_cast expects an npu tensor, got ", t.device());
    const void* data = t.unsafeGetTensorImpl()->unsafe_storage().data();
    return data != nullptr && torch_npu::allocator::set_storage_format(data, format);
  });

  // logging (torch_npu.utils._logging): per-component thresholds and a sink
  m.def("_emu_set_log_levels", [](const std::map<std::string, int>& levels) {
    for (int c = 0; c < torch_npu::log::NUM_COMPONENTS; ++c) {
      auto comp = static_cast<torch_npu::log::Component>(c);
      auto it = levels.find(torch_npu::log::component_name(comp));
      torch_npu::log::set_level(comp, it == levels.end() ? INT_MAX : it->second);
    }
  });
  m.def("_emu_set_log_sink", [](py::object fn) {
    if (fn.is_none()) {
      torch_npu::log::set_sink(nullptr);
      return;
    }
    g_log_sink = new py::function(fn.cast<py::function>());
    torch_npu::log::set_sink(&python_log_sink);
  });

  // profiler device timeline (torch_npu.profiler)
  m.def("_npu_timeline_enable", [](bool on) { torch_npu::timeline::enable(on); });
  m.def("_npu_timeline_enabled", [] { return torch_npu::timeline::enabled(); });
  m.def("_npu_timeline_drain", [] {
    std::vector<torch_npu::timeline::Event> events = torch_npu::timeline::drain();
    py::list out;
    for (const auto& e : events) {
      out.append(py::make_tuple(e.name, e.device, e.stream, e.start_ns, e.end_ns,
                                torch_npu::timeline::kind_name(e.kind), e.bytes, e.thread_id));
    }
    return out;
  });

  // npu_fusion_attention's C++ kernel reads flash.CHUNK_ELEMENTS (the row max's blocks) and
  // flash.SMALL_ELEMENTS (the one-block dropout path's limit), which Python owns and tests patch
  torch_npu::kernels::set_flash_sizes_reader(+[]() -> torch_npu::kernels::FlashSizes {
    py::gil_scoped_acquire gil;
    static py::handle flash = py::module_::import("torch_npu.op_plugin.attention.flash").release();
    return {flash.attr("CHUNK_ELEMENTS").cast<int64_t>(), flash.attr("SMALL_ELEMENTS").cast<int64_t>()};
  });

  // npu_fusion_attention's common case (op_plugin/attention/fusion.py): None
  // when the call needs the Python engine
  m.def("_npu_fusion_attention_sdpa",
        [](const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, int64_t head_num,
           const std::string& input_layout, const std::optional<at::Tensor>& atten_mask, double scale,
           int64_t sparse_mode, int64_t chunk_elements) -> py::object {
          std::optional<torch_npu::kernels::FusionAttentionResult> r;
          {
            py::gil_scoped_release no_gil;
            r = torch_npu::kernels::fusion_attention_sdpa(query, key, value, head_num, input_layout, atten_mask,
                                                          scale, sparse_mode, chunk_elements);
          }
          if (!r) return py::none();
          return py::cast(*r);
        });

  m.def("_npu_fusion_attention_small_dropout_applies",
        [](const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, int64_t head_num,
           const std::string& input_layout, const std::optional<at::Tensor>& atten_mask, double scale,
           int64_t sparse_mode, int64_t chunk_elements, int64_t small_elements) {
          return torch_npu::kernels::fusion_attention_small_dropout_applies(query, key, value, head_num, input_layout,
                                                                            atten_mask, scale, sparse_mode,
                                                                            chunk_elements, small_elements);
        });
  m.def("_npu_fusion_attention_small_dropout",
        [](const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, int64_t head_num,
           const std::string& input_layout, const std::optional<at::Tensor>& atten_mask, double scale,
           int64_t sparse_mode, double keep_prob, int64_t seed, int64_t offset) {
          py::gil_scoped_release no_gil;
          return torch_npu::kernels::fusion_attention_small_dropout(query, key, value, head_num, input_layout,
                                                                    atten_mask, scale, sparse_mode, keep_prob, seed,
                                                                    offset);
        });

  // zero-copy bridges for code that runs CPU kernels on npu memory
  // (graph mode runs Inductor's CPU code this way)
  m.def("_npu_cpu_alias", [](const at::Tensor& t) {
    TORCH_CHECK(t.device().type() == c10::DeviceType::PrivateUse1, "_npu_cpu_alias expects an npu tensor, got ",
                t.device());
    return torch_npu::exec::cpu_alias(t);
  });
  m.def("_npu_adopt", [](const at::Tensor& t, int64_t device) {
    TORCH_CHECK(t.device().is_cpu(), "_npu_adopt expects a CPU tensor, got ", t.device());
    return torch_npu::exec::share_result(t, checked_device(device));
  });
  // chip-numerics mode: round an fp32 cube-op input (a CPU alias) to HF32
  // (kind 0) or fp16 (kind 1); returns (rounded copy, elements changed)
  // (isa: the best instruction set to use, 0 portable, 1 AVX2, 2 AVX-512; for tests)
  m.def(
      "_emu_round_cube_input",
      [](const at::Tensor& t, int kind, int isa) {
        TORCH_CHECK(kind == 0 || kind == 1, "_emu_round_cube_input: kind must be 0 (HF32) or 1 (fp16), got ", kind);
        TORCH_CHECK(isa >= 0 && isa <= 2, "_emu_round_cube_input: isa must be 0, 1 or 2, got ", isa);
        auto [rounded, changed] = torch_npu::numerics::round_cube_input(
            t, kind == 0 ? torch_npu::numerics::CubeRounding::HF32 : torch_npu::numerics::CubeRounding::FP16,
            static_cast<torch_npu::numerics::RoundingIsa>(isa));
        return py::make_tuple(rounded, changed);
      },
      py::arg("t"), py::arg("kind"), py::arg("isa") = 2);
  m.def("_emu_round_cube_input_isa", [] { return static_cast<int>(torch_npu::numerics::best_rounding_isa()); });
  // the chip kernels (aten/ChipNumericsKernels.cpp): installed while chip mode
  // is on; each family's rounding (-1 keep, 0 HF32, 1 fp16) pushed by Python
  m.def("_emu_chip_kernels", &torch_npu::numerics::enable_chip_kernels);
  m.def("_emu_set_cube_rounding", [](int matmul, int conv) {
    torch_npu::numerics::set_family_rounding(torch_npu::numerics::CubeFamily::Matmul, matmul);
    torch_npu::numerics::set_family_rounding(torch_npu::numerics::CubeFamily::Conv, conv);
  });
  // [(op, calls, kinds: bit 0 HF32 / bit 1 fp16, elements, changed)]
  m.def("_emu_numerics_report", [] {
    py::list out;
    for (const auto& c : torch_npu::numerics::chip_report()) {
      out.append(py::make_tuple(c.op, c.calls, c.kinds, c.elements, c.changed));
    }
    return out;
  });
  m.def("_emu_reset_numerics_report", &torch_npu::numerics::reset_chip_report);
  py::class_<KernelScopeContext>(m, "_NpuKernelScope")
      .def(py::init([](const std::string& name, const std::string& overload, int64_t device) {
        return KernelScopeContext{torch_npu::exec::find_op(name.c_str(), overload.c_str()), checked_device(device),
                                  nullptr};
      }))
      .def("__enter__", [](KernelScopeContext& c) { c.enter(); return &c; }, py::return_value_policy::reference)
      .def("__exit__", [](KernelScopeContext& c, py::args) { c.exit(); return false; });
  py::class_<MemoryScopeContext>(m, "_DeviceMemoryScope")
      .def(py::init([](int64_t device) { return MemoryScopeContext{checked_device(device)}; }))
      .def("__enter__", [](MemoryScopeContext& c) { c.enter(); return &c; }, py::return_value_policy::reference)
      .def("__exit__", [](MemoryScopeContext& c, py::args) { c.exit(); return false; });
}
