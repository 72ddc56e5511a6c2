#include "distributed/ProcessGroupHCCL.h"

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <array>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <utility>

#include "aten/OpExecution.h"
#include "distributed/CollectiveCheck.h"
#include "profiler/DeviceTimeline.h"

namespace torch_npu::distributed {
namespace {

std::mutex g_factory_mu;
GlooFactory g_factory;

GlooFactory factory() {
  std::lock_guard<std::mutex> g(g_factory_mu);
  TORCH_CHECK(g_factory, "ProcessGroupHCCL: torch_npu.distributed is not initialised (no Gloo factory)");
  return g_factory;
}

// The HCCL task names the real profiler shows for each collective.
const char* hcom_name(c10d::OpType t) {
  switch (t) {
    case c10d::OpType::BROADCAST: return "hcom_broadcast_";
    case c10d::OpType::ALLREDUCE:
    case c10d::OpType::ALLREDUCE_COALESCED: return "hcom_allReduce_";
    case c10d::OpType::REDUCE: return "hcom_reduce_";
    case c10d::OpType::ALLGATHER:
    case c10d::OpType::_ALLGATHER_BASE:
    case c10d::OpType::ALLGATHER_COALESCED: return "hcom_allGather_";
    case c10d::OpType::GATHER: return "hcom_gather_";
    case c10d::OpType::SCATTER: return "hcom_scatter_";
    case c10d::OpType::REDUCE_SCATTER:
    case c10d::OpType::_REDUCE_SCATTER_BASE: return "hcom_reduceScatter_";
    case c10d::OpType::ALLTOALL_BASE:
    case c10d::OpType::ALLTOALL: return "hcom_alltoallv_";
    case c10d::OpType::SEND: return "hcom_send_";
    case c10d::OpType::RECV:
    case c10d::OpType::RECVANYSOURCE: return "hcom_receive_";
    case c10d::OpType::BARRIER: return "hcom_barrier_";
    default: return "hcom_collective_";
  }
}

// Work of one collective: the Gloo work carries the data; our future
// completes (with the npu tensors) once Gloo's has and post-processing ran.
class WorkHCCL final : public c10d::Work {
 public:
  WorkHCCL(int rank, c10d::OpType type, c10::intrusive_ptr<c10d::Work> inner,
           c10::intrusive_ptr<c10::ivalue::Future> future, std::vector<at::Tensor> outputs,
           std::function<void(std::exception_ptr)> complete_on_wait)
      : c10d::Work(rank, type),
        inner_(std::move(inner)),
        future_(std::move(future)),
        outputs_(std::move(outputs)),
        complete_on_wait_(std::move(complete_on_wait)) {}

  bool isCompleted() override { return future_->completed(); }
  bool isSuccess() const override { return future_->completed() && !future_->hasError(); }
  std::exception_ptr exception() const override { return future_->exception_ptr(); }
  std::vector<at::Tensor> result() override { return outputs_; }
  void synchronize() override {}
  bool wait(std::chrono::milliseconds timeout) override {
    std::exception_ptr inner_error;
    try {
      inner_->wait(timeout);
    } catch (...) {
      inner_error = std::current_exception();
    }
    if (complete_on_wait_) {
      // Gloo's point-to-point works have no future and must be waited on
      // exactly once (a second wait blocks for another message).
      std::call_once(once_, [&] { complete_on_wait_(inner_error); });
    }
    if (inner_error && !future_->completed()) std::rethrow_exception(inner_error);
    future_->wait();
    if (future_->hasError()) std::rethrow_exception(future_->exception_ptr());
    return true;
  }
  void abort() override { inner_->abort(); }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  c10::intrusive_ptr<c10d::Work> inner_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::vector<at::Tensor> outputs_;
  std::function<void(std::exception_ptr)> complete_on_wait_;
  std::once_flag once_;
};

// Work of a coalesced block (startCoalescing .. endCoalescing): Gloo has no
// coalescing, so the calls ran one by one; this work completes when all did.
class CoalescedWorkHCCL final : public c10d::Work {
 public:
  CoalescedWorkHCCL(int rank, std::vector<c10::intrusive_ptr<c10d::Work>> works, std::vector<at::Tensor> outputs,
                    std::vector<c10::Device> devices)
      : c10d::Work(rank, c10d::OpType::COALESCED),
        works_(std::move(works)),
        future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                         std::move(devices))),
        outputs_(std::move(outputs)) {
    if (works_.empty()) {
      future_->markCompleted(c10::IValue(c10::List<at::Tensor>(outputs_)));
      return;
    }
    struct State {
      std::mutex mu;
      size_t remaining;
    };
    auto state = std::make_shared<State>();
    state->remaining = works_.size();
    for (auto& w : works_) {
      w->getFuture()->addCallback([state, future = future_, outputs = outputs_](c10::ivalue::Future& f) {
        std::lock_guard<std::mutex> g(state->mu);
        if (future->completed()) return;
        if (f.hasError()) {
          future->setError(f.exception_ptr());
        } else if (--state->remaining == 0) {
          future->markCompleted(c10::IValue(c10::List<at::Tensor>(outputs)));
        }
      });
    }
  }

  bool isCompleted() override { return future_->completed(); }
  bool isSuccess() const override { return future_->completed() && !future_->hasError(); }
  std::exception_ptr exception() const override { return future_->exception_ptr(); }
  std::vector<at::Tensor> result() override { return outputs_; }
  void synchronize() override {}
  bool wait(std::chrono::milliseconds timeout) override {
    for (auto& w : works_) w->wait(timeout);
    future_->wait();
    if (future_->hasError()) std::rethrow_exception(future_->exception_ptr());
    return true;
  }
  void abort() override {
    for (auto& w : works_) w->abort();
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  std::vector<c10::intrusive_ptr<c10d::Work>> works_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::vector<at::Tensor> outputs_;
};

std::vector<c10::Device> devices_of(const std::vector<at::Tensor>& tensors) {
  std::vector<c10::Device> out;
  for (const auto& t : tensors) {
    if (!t.defined() || !t.device().is_privateuseone()) continue;
    if (std::find(out.begin(), out.end(), t.device()) == out.end()) out.push_back(t.device());
  }
  return out;
}

double premul_factor(const c10d::ReduceOp& op) {
  auto* s = dynamic_cast<c10d::PreMulSumSupplement*>(op.supplement_.get());
  TORCH_CHECK(s != nullptr, "ProcessGroupHCCL: PREMUL_SUM without a factor");
  return s->tensor_factor.defined() ? s->tensor_factor.item<double>() : s->double_factor;
}

}  // namespace

void set_gloo_factory(GlooFactory f) {
  std::lock_guard<std::mutex> g(g_factory_mu);
  g_factory = std::move(f);
}

ProcessGroupHCCL::Options::Options(bool is_high_priority_stream)
    : c10d::Backend::Options("hccl"), is_high_priority_stream(is_high_priority_stream) {}

struct ProcessGroupHCCL::Call {
  c10d::OpType type;
  std::vector<at::Tensor> outputs;     // npu tensors reported by the work and future
  std::vector<at::Tensor> signature;   // npu tensors whose shapes are fingerprinted
  bool shapes_must_match = true;       // false where ranks legitimately differ
  bool collective = true;              // false for point-to-point calls
  int64_t root = -1;
  int64_t reduce = -1;
  std::function<void()> finalize;      // after Gloo completed (AVG division, copies)

  // A CPU alias of an npu argument (checks the device).
  at::Tensor alias(const at::Tensor& t) {
    TORCH_CHECK(t.defined(), "ProcessGroupHCCL: undefined tensor passed to ", op_name(type));
    TORCH_CHECK(t.device().is_privateuseone(), "ProcessGroupHCCL: ", op_name(type),
                " expects tensors on an npu device, got a tensor on ", t.device(),
                " (use the gloo backend for CPU tensors, e.g. init_process_group(\"cpu:gloo,npu:hccl\"))");
    TORCH_CHECK(!t.is_sparse(), "ProcessGroupHCCL: sparse tensors are not supported by HCCL");
    return exec::cpu_alias(t);
  }
  std::vector<at::Tensor> alias(const std::vector<at::Tensor>& ts) {
    std::vector<at::Tensor> out;
    out.reserve(ts.size());
    for (const auto& t : ts) out.push_back(alias(t));
    return out;
  }
  std::vector<std::vector<at::Tensor>> alias(const std::vector<std::vector<at::Tensor>>& tss) {
    std::vector<std::vector<at::Tensor>> out;
    for (const auto& ts : tss) out.push_back(alias(ts));
    return out;
  }
  int64_t bytes() const {
    int64_t n = 0;
    for (const auto& t : signature) n += t.numel() * t.element_size();
    for (const auto& t : outputs) n = std::max<int64_t>(n, t.numel() * t.element_size());
    return n;
  }
};

ProcessGroupHCCL::ProcessGroupHCCL(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                   c10::intrusive_ptr<Options> options)
    : c10d::Backend(rank, size), store_(store), options_(std::move(options)) {
  if (!options_) options_ = c10::make_intrusive<Options>();
  auto timeout = options_->timeout;
  if (options_->op_timeout > 0) timeout = std::chrono::milliseconds(options_->op_timeout);
  GlooFactory make = factory();
  gloo_ = make(store_, rank, size, timeout);
  check_mode_ = check_mode_from_settings();
  check_ = check_mode_ != CheckMode::OFF;
  if (check_ && size > 1) {
    checker_ = make(c10::make_intrusive<c10d::PrefixStore>("hccl_fingerprint", store_), rank, size, timeout);
  } else {
    check_ = false;
  }
}

ProcessGroupHCCL::~ProcessGroupHCCL() = default;

void ProcessGroupHCCL::setTimeout(std::chrono::milliseconds timeout) {
  options_->timeout = timeout;
  gloo_->setTimeout(timeout);
  if (checker_) checker_->setTimeout(timeout);
}

at::Tensor ProcessGroupHCCL::check_fingerprint(const Call& call, const at::Tensor& payload) {
  fingerprints_++;
  return exchange_fingerprints(*checker_, getRank(), getSize(), getGroupUid(),
                               {seq_.load(), call.type, call.signature, call.shapes_must_match, call.root, call.reduce},
                               payload);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::launch(Call& call,
                                                         const std::function<c10::intrusive_ptr<c10d::Work>()>& start) {
  // Point-to-point calls involve two ranks only: they are neither
  // fingerprinted nor counted in the group's collective sequence.
  if (call.collective) {
    if (check_ && should_check(check_mode_, seq_.load(), call.shapes_must_match, call.signature)) {
      check_fingerprint(call);
    }
    seq_++;
  }
  const bool timed = timeline::enabled();
  const int64_t t0 = timed ? timeline::now_ns() : 0;
  const int device = call.outputs.empty() ? 0 : std::max<int>(0, call.outputs[0].device().index());
  const int64_t nbytes = call.bytes();

  c10::intrusive_ptr<c10d::Work> inner = start();
  auto future = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                         devices_of(call.outputs));
  const std::string context = "HCCL (emulated on Gloo): " + op_name(call.type) + " #" + std::to_string(seq_.load()) +
                              " failed on rank " + std::to_string(getRank()) + " of group '" + getGroupUid() + "': ";
  auto finish = [future, finalize = call.finalize, outputs = call.outputs, timed, t0, device, nbytes,
                 type = call.type, context](const std::exception_ptr& error) {
    if (error) {
      try {
        C10_THROW_ERROR(DistBackendError, context + exception_text(error) +
                                              ". A peer rank has probably exited or is stuck "
                                              "(collective timeout: HCCL_EXEC_TIMEOUT / the group timeout).");
      } catch (...) {
        future->setErrorIfNeeded(std::current_exception());
      }
      return;
    }
    try {
      if (finalize) finalize();
    } catch (...) {
      future->setErrorIfNeeded(std::current_exception());
      return;
    }
    if (timed) {
      timeline::record({hcom_name(type), device, 0, t0, timeline::now_ns(), timeline::Kind::Communication, nbytes, 0});
    }
    future->markCompleted(c10::IValue(c10::List<at::Tensor>(outputs)));
  };

  c10::intrusive_ptr<c10::ivalue::Future> inner_future;
  try {
    inner_future = inner->getFuture();
  } catch (const c10::Error&) {
    inner_future = nullptr;  // e.g. point-to-point works: completed in wait()
  }
  std::function<void(std::exception_ptr)> complete_on_wait;
  if (inner_future) {
    inner_future->addCallback([finish](c10::ivalue::Future& f) {
      finish(f.hasError() ? f.exception_ptr() : nullptr);
    });
  } else {
    complete_on_wait = [finish](std::exception_ptr error) { finish(error); };
  }
  auto work = c10::make_intrusive<WorkHCCL>(getRank(), call.type, inner, future, call.outputs, complete_on_wait);
  if (coalescing_) coalesced_.push_back(work);
  return work;
}

// ---- collectives ---------------------------------------------------------

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::broadcast(std::vector<at::Tensor>& tensors,
                                                           const c10d::BroadcastOptions& opts) {
  Call call{c10d::OpType::BROADCAST, tensors, tensors};
  call.root = opts.rootRank;
  auto cpu = call.alias(tensors);
  return launch(call, [&] { return gloo_->broadcast(cpu, opts); });
}

namespace {
// Gloo has no AVG and no PREMUL_SUM: SUM, then divide / pre-scale.
c10d::ReduceOp gloo_reduce_op(const c10d::ReduceOp& op) {
  if (op == c10d::ReduceOp::AVG || op == c10d::ReduceOp::PREMUL_SUM) return c10d::ReduceOp(c10d::ReduceOp::SUM);
  return op;
}
void divide_by(std::vector<at::Tensor>& cpu, int size) {
  for (auto& t : cpu) {
    if (at::isFloatingType(t.scalar_type()) || at::isComplexType(t.scalar_type())) {
      t.div_(size);
    } else {
      t.div_(size, "trunc");
    }
  }
}
// PREMUL_SUM: scale the inputs first, in place where the buffer receives the
// result anyway, else as copies so the caller's inputs stay untouched.
void premultiply(std::vector<at::Tensor>& inputs, const c10d::ReduceOp& op, bool in_place) {
  if (op != c10d::ReduceOp::PREMUL_SUM) return;
  const double f = premul_factor(op);
  for (auto& t : inputs) {
    if (in_place) {
      t.mul_(f);
    } else {
      t = t * f;
    }
  }
}
// AVG: divide the results by the group size once Gloo's SUM completed.
std::function<void()> average_after(const c10d::ReduceOp& op, std::vector<at::Tensor> outputs, int size) {
  if (op != c10d::ReduceOp::AVG) return {};
  return [outputs, size]() mutable { divide_by(outputs, size); };
}
}  // namespace

// A small all_reduce rides on its own fingerprint exchange: the packet that
// the check sends anyway carries the data, every rank reduces the gathered
// contributions locally (in rank order, so all ranks get the same bits), and
// the call costs one round trip instead of two.
bool ProcessGroupHCCL::fits_fingerprint(const std::vector<at::Tensor>& tensors, const c10d::ReduceOp& op) const {
  if (!check_ || coalescing_ || tensors.size() != 1 || !tensors[0].defined()) return false;
  const auto& t = tensors[0];
  if (!t.device().is_privateuseone() || t.is_sparse() || t.is_complex() || t.scalar_type() == at::kBool) return false;
  if (t.numel() * t.element_size() > kPayloadBytes) return false;
  return op != c10d::ReduceOp::UNUSED;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::allreduce_small(std::vector<at::Tensor>& tensors,
                                                                 const c10d::AllreduceOptions& opts) {
  Call call{c10d::OpType::ALLREDUCE, tensors, tensors};
  const auto op = opts.reduceOp;
  call.reduce = static_cast<int64_t>(static_cast<c10d::ReduceOp::RedOpType>(op));
  at::Tensor cpu = call.alias(tensors[0]);
  const bool timed = timeline::enabled();
  const int64_t t0 = timed ? timeline::now_ns() : 0;
  at::Tensor all = check_fingerprint(call, cpu.contiguous());
  seq_++;
  const int64_t n = cpu.numel();
  std::vector<at::Tensor> parts;
  for (int r = 0; r < getSize(); ++r) {
    int64_t* base = all.data_ptr<int64_t>() + r * kPacketWords + kFingerprintFields;
    parts.push_back(at::from_blob(base, {n}, cpu.options()));
  }
  at::Tensor stacked = at::stack(parts);  // (world, n)
  at::Tensor out;
  const auto dtype = cpu.scalar_type();
  if (op == c10d::ReduceOp::SUM || op == c10d::ReduceOp::AVG || op == c10d::ReduceOp::PREMUL_SUM) {
    if (op == c10d::ReduceOp::PREMUL_SUM) stacked = stacked * premul_factor(op);
    out = stacked.sum(0, false, dtype);
    if (op == c10d::ReduceOp::AVG) {
      std::vector<at::Tensor> v{out};
      divide_by(v, getSize());
    }
  } else if (op == c10d::ReduceOp::PRODUCT) {
    out = stacked.prod(0, false, dtype);
  } else if (op == c10d::ReduceOp::MIN) {
    out = stacked.amin(0);
  } else if (op == c10d::ReduceOp::MAX) {
    out = stacked.amax(0);
  } else {
    TORCH_CHECK(at::isIntegralType(dtype, false), "ProcessGroupHCCL: ", reduce_name(call.reduce),
                " needs an integer tensor, got ", dtype);
    out = parts[0].clone();
    for (int r = 1; r < getSize(); ++r) {
      if (op == c10d::ReduceOp::BAND) out.bitwise_and_(parts[r]);
      else if (op == c10d::ReduceOp::BOR) out.bitwise_or_(parts[r]);
      else out.bitwise_xor_(parts[r]);
    }
  }
  cpu.copy_(out.view(cpu.sizes()));
  if (timed) {
    timeline::record({hcom_name(call.type), std::max<int>(0, tensors[0].device().index()), 0, t0, timeline::now_ns(),
                      timeline::Kind::Communication, call.bytes(), 0});
  }
  return c10::make_intrusive<CoalescedWorkHCCL>(getRank(), std::vector<c10::intrusive_ptr<c10d::Work>>{}, tensors,
                                                devices_of(tensors));
}

// all_reduce, its coalesced form and reduce share one body: Gloo gets SUM for
// AVG and PREMUL_SUM, inputs are pre-scaled for PREMUL_SUM, and AVG divides
// the results (only where they are defined: every rank, or reduce's root).
template <typename Opts, typename Start>
c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::reduce_like(c10d::OpType type, std::vector<at::Tensor>& tensors,
                                                             const Opts& opts, int64_t root, Start start) {
  Call call{type, tensors, tensors};
  call.root = root;
  call.reduce = static_cast<int64_t>(static_cast<c10d::ReduceOp::RedOpType>(opts.reduceOp));
  auto cpu = call.alias(tensors);
  Opts o = opts;
  o.reduceOp = gloo_reduce_op(opts.reduceOp);
  premultiply(cpu, opts.reduceOp, /*in_place=*/true);
  if (root < 0 || getRank() == root) call.finalize = average_after(opts.reduceOp, cpu, getSize());
  return launch(call, [&] { return start(cpu, o); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::allreduce(std::vector<at::Tensor>& tensors,
                                                           const c10d::AllreduceOptions& opts) {
  if (fits_fingerprint(tensors, opts.reduceOp)) return allreduce_small(tensors, opts);
  return reduce_like(c10d::OpType::ALLREDUCE, tensors, opts, -1,
                     [this](std::vector<at::Tensor>& cpu, c10d::AllreduceOptions& o) { return gloo_->allreduce(cpu, o); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                     const c10d::AllreduceCoalescedOptions& opts) {
  return reduce_like(c10d::OpType::ALLREDUCE_COALESCED, tensors, opts, -1,
                     [this](std::vector<at::Tensor>& cpu, c10d::AllreduceCoalescedOptions& o) {
                       return gloo_->allreduce_coalesced(cpu, o);
                     });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::reduce(std::vector<at::Tensor>& tensors,
                                                        const c10d::ReduceOptions& opts) {
  return reduce_like(c10d::OpType::REDUCE, tensors, opts, opts.rootRank,
                     [this](std::vector<at::Tensor>& cpu, c10d::ReduceOptions& o) { return gloo_->reduce(cpu, o); });
}

namespace {
// Gloo's single-tensor gather/scatter want the big tensor shaped
// (world * rows, ...) like the small one; c10d (as NCCL) only asks for
// world * numel elements, e.g. a (world, n) output for an (n,) input.
at::Tensor flat(const at::Tensor& t, c10d::OpType type) {
  TORCH_CHECK(t.is_contiguous(), "ProcessGroupHCCL: ", op_name(type), " expects contiguous tensors");
  return t.view({-1});
}

std::vector<at::Tensor> flatten(const std::vector<std::vector<at::Tensor>>& tss) {
  std::vector<at::Tensor> out;
  for (const auto& ts : tss) out.insert(out.end(), ts.begin(), ts.end());
  return out;
}
}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                           std::vector<at::Tensor>& inputs,
                                                           const c10d::AllgatherOptions& opts) {
  Call call{c10d::OpType::ALLGATHER, flatten(outputs), inputs};
  auto out = call.alias(outputs);
  auto in = call.alias(inputs);
  return launch(call, [&] { return gloo_->allgather(out, in, opts); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                 const c10d::AllgatherOptions& opts) {
  Call call{c10d::OpType::_ALLGATHER_BASE, {output}, {input}};
  auto out = flat(call.alias(output), call.type);
  auto in = flat(call.alias(input), call.type);
  return launch(call, [&] { return gloo_->_allgather_base(out, in, opts); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                                     std::vector<at::Tensor>& inputs,
                                                                     const c10d::AllgatherOptions& opts) {
  Call call{c10d::OpType::ALLGATHER_COALESCED, flatten(outputs), inputs};
  auto out = call.alias(outputs);
  auto in = call.alias(inputs);
  return launch(call, [&] { return gloo_->allgather_coalesced(out, in, opts); });
}

// One single-tensor collective per pair; the returned work completes with all.
c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                                 std::vector<at::Tensor>& inputs,
                                                                                 const c10d::AllgatherOptions& opts) {
  TORCH_CHECK(outputs.size() == inputs.size(),
              "ProcessGroupHCCL: allgather_into_tensor_coalesced needs as many outputs as inputs");
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  for (size_t i = 0; i < inputs.size(); ++i) works.push_back(_allgather_base(outputs[i], inputs[i], opts));
  return c10::make_intrusive<CoalescedWorkHCCL>(getRank(), std::move(works), outputs, devices_of(outputs));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                        std::vector<at::Tensor>& inputs,
                                                        const c10d::GatherOptions& opts) {
  Call call{c10d::OpType::GATHER, flatten(outputs), inputs};
  call.root = opts.rootRank;
  auto out = call.alias(outputs);
  auto in = call.alias(inputs);
  return launch(call, [&] { return gloo_->gather(out, in, opts); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::scatter(std::vector<at::Tensor>& outputs,
                                                         std::vector<std::vector<at::Tensor>>& inputs,
                                                         const c10d::ScatterOptions& opts) {
  Call call{c10d::OpType::SCATTER, outputs, outputs};
  call.root = opts.rootRank;
  auto out = call.alias(outputs);
  auto in = call.alias(inputs);
  return launch(call, [&] { return gloo_->scatter(out, in, opts); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                                const c10d::ReduceScatterOptions& opts) {
  Call call{c10d::OpType::REDUCE_SCATTER, outputs, flatten(inputs)};
  call.reduce = static_cast<int64_t>(static_cast<c10d::ReduceOp::RedOpType>(opts.reduceOp));
  auto out = call.alias(outputs);
  auto in = call.alias(inputs);
  c10d::ReduceScatterOptions o = opts;
  o.reduceOp = gloo_reduce_op(opts.reduceOp);
  for (auto& ts : in) premultiply(ts, opts.reduceOp, /*in_place=*/false);
  call.finalize = average_after(opts.reduceOp, out, getSize());
  return launch(call, [&] { return gloo_->reduce_scatter(out, in, o); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                      const c10d::ReduceScatterOptions& opts) {
  Call call{c10d::OpType::_REDUCE_SCATTER_BASE, {output}, {input}};
  call.reduce = static_cast<int64_t>(static_cast<c10d::ReduceOp::RedOpType>(opts.reduceOp));
  auto out = flat(call.alias(output), call.type);
  auto in = flat(call.alias(input), call.type);
  c10d::ReduceScatterOptions o = opts;
  o.reduceOp = gloo_reduce_op(opts.reduceOp);
  if (opts.reduceOp == c10d::ReduceOp::PREMUL_SUM) in = in * premul_factor(opts.reduceOp);  // a copy
  call.finalize = average_after(opts.reduceOp, {out}, getSize());
  return launch(call, [&] { return gloo_->_reduce_scatter_base(out, in, o); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK(outputs.size() == inputs.size(),
              "ProcessGroupHCCL: reduce_scatter_tensor_coalesced needs as many outputs as inputs");
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  for (size_t i = 0; i < inputs.size(); ++i) works.push_back(_reduce_scatter_base(outputs[i], inputs[i], opts));
  return c10::make_intrusive<CoalescedWorkHCCL>(getRank(), std::move(works), outputs, devices_of(outputs));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                               std::vector<int64_t>& output_split_sizes,
                                                               std::vector<int64_t>& input_split_sizes,
                                                               const c10d::AllToAllOptions& opts) {
  Call call{c10d::OpType::ALLTOALL_BASE, {output}, {input}};
  call.shapes_must_match = output_split_sizes.empty() && input_split_sizes.empty();
  auto out = call.alias(output);
  auto in = call.alias(input);
  return launch(call, [&] { return gloo_->alltoall_base(out, in, output_split_sizes, input_split_sizes, opts); });
}

// Gloo has no list all_to_all: pack into one buffer, run the split form,
// and unpack into the outputs when it completes.
c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::alltoall(std::vector<at::Tensor>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const c10d::AllToAllOptions& opts) {
  Call call{c10d::OpType::ALLTOALL, outputs, inputs};
  call.shapes_must_match = false;
  auto out = call.alias(outputs);
  auto in = call.alias(inputs);
  TORCH_CHECK(static_cast<int>(in.size()) == getSize() && static_cast<int>(out.size()) == getSize(),
              "ProcessGroupHCCL: all_to_all expects one input and one output tensor per rank");
  std::vector<at::Tensor> flat_in;
  std::vector<int64_t> in_splits, out_splits;
  for (auto& t : in) {
    flat_in.push_back(t.reshape({-1}));
    in_splits.push_back(t.numel());
  }
  for (auto& t : out) out_splits.push_back(t.numel());
  at::Tensor send = at::cat(flat_in);
  int64_t total_out = 0;
  for (auto n : out_splits) total_out += n;
  at::Tensor recv = at::empty({total_out}, send.options());
  call.finalize = [out, recv, out_splits]() mutable {
    int64_t off = 0;
    for (size_t i = 0; i < out.size(); ++i) {
      out[i].copy_(recv.narrow(0, off, out_splits[i]).view(out[i].sizes()));
      off += out_splits[i];
    }
  };
  return launch(call, [&] { return gloo_->alltoall_base(recv, send, out_splits, in_splits, opts); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) {
  Call call{c10d::OpType::SEND, tensors, tensors};
  auto cpu = call.alias(tensors);
  call.collective = false;
  return launch(call, [&] { return gloo_->send(cpu, dst_rank, tag); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) {
  Call call{c10d::OpType::RECV, tensors, tensors};
  auto cpu = call.alias(tensors);
  call.collective = false;
  return launch(call, [&] { return gloo_->recv(cpu, src_rank, tag); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  Call call{c10d::OpType::RECVANYSOURCE, tensors, tensors};
  auto cpu = call.alias(tensors);
  call.collective = false;
  return launch(call, [&] { return gloo_->recvAnysource(cpu, tag); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::barrier(const c10d::BarrierOptions& opts) {
  Call call{c10d::OpType::BARRIER, {}, {}};
  return launch(call, [&] { return gloo_->barrier(opts); });
}

void ProcessGroupHCCL::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
  gloo_->monitoredBarrier(opts, wait_all_ranks);
}

// Gloo has no coalescing: calls in the block run as they come, and the
// block's work completes when all of them have.
void ProcessGroupHCCL::startCoalescing() {
  TORCH_CHECK(!coalescing_, "ProcessGroupHCCL: startCoalescing called twice without endCoalescing");
  coalescing_ = true;
  coalesced_.clear();
}

c10::intrusive_ptr<c10d::Work> ProcessGroupHCCL::endCoalescing() {
  TORCH_CHECK(coalescing_, "ProcessGroupHCCL: endCoalescing called without startCoalescing");
  coalescing_ = false;
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  works.swap(coalesced_);
  std::vector<at::Tensor> outputs;
  for (auto& w : works) {
    auto r = w->result();
    outputs.insert(outputs.end(), r.begin(), r.end());
  }
  return c10::make_intrusive<CoalescedWorkHCCL>(getRank(), std::move(works), outputs, devices_of(outputs));
}

c10::intrusive_ptr<c10d::Backend> ProcessGroupHCCL::split(const c10::intrusive_ptr<c10d::Store>& store,
                                                          const std::vector<int>& ranks,
                                                          const c10::intrusive_ptr<c10d::Backend::Options>& opts) {
  // Every rank of this group takes part in every split (non-members too), so
  // this count agrees across ranks. c10d's store prefix for the child is
  // derived from how many groups each rank has registered, which differs
  // after a new_group that left some ranks out; NCCL does not mind (its
  // split needs no store), but Gloo's mesh must rendezvous under one prefix.
  const uint64_t split_index = split_count_++;
  auto it = std::find(ranks.begin(), ranks.end(), getRank());
  if (it == ranks.end()) return nullptr;  // this rank is not in the new group
  std::ostringstream prefix;
  prefix << "hccl_split/" << split_index << "/";
  for (int r : ranks) prefix << r << ",";
  auto split_store = c10::make_intrusive<c10d::PrefixStore>(prefix.str(), store_);
  auto options = c10::make_intrusive<Options>(options_->is_high_priority_stream);
  options->timeout = opts ? opts->timeout : options_->timeout;
  if (opts) {
    options->global_ranks_in_group = opts->global_ranks_in_group;
    options->group_name = opts->group_name;
  }
  options->hccl_config = options_->hccl_config;
  options->op_timeout = options_->op_timeout;
  auto pg = c10::make_intrusive<ProcessGroupHCCL>(split_store, static_cast<int>(it - ranks.begin()),
                                                  static_cast<int>(ranks.size()), options);
  pg->check_mode_ = check_mode_;
  pg->check_ = check_ && pg->checker_;
  return pg;
}

void ProcessGroupHCCL::abort() {
  gloo_->abort();
  if (checker_) checker_->abort();
}

namespace {
// What a group holds once shut down: every later call fails with c10d's
// "Backend <name> does not support <op>", the name saying why.
class ShutDownBackend final : public c10d::Backend {
 public:
  ShutDownBackend(int rank, int size) : c10d::Backend(rank, size) {}
  const std::string getBackendName() const override {
    return "hccl (this process group was shut down: create a new one)";
  }
};
}  // namespace

// Gloo has no shutdown of its own: its worker and transport threads stop only
// when the ProcessGroupGloo is destroyed. Left running until the interpreter
// finalizes, a Gloo thread that drops the last reference to an npu tensor
// whose Python object is gone needs the GIL: the rank then hangs at exit (the
// finalizing thread holds the GIL and joins Gloo's threads) or aborts
// ("terminate called without an active exception": Python ends a thread that
// asks for the GIL during finalization). So the groups are released here,
// where the GIL is not held (c10d's shutdown binding and ours release it), and
// their threads are joined while Python is still whole.
void ProcessGroupHCCL::shutdown() {
  auto closed = c10::make_intrusive<ShutDownBackend>(getRank(), getSize());
  check_ = false;
  auto gloo = std::exchange(gloo_, closed);
  auto checker = std::exchange(checker_, checker_ ? closed : nullptr);
  gloo.reset();
  checker.reset();
}

}  // namespace torch_npu::distributed
