// ProcessGroupHCCL: torch_npu's "hccl" c10d backend, emulated on PyTorch's
// Gloo engine. Every collective runs on a ProcessGroupGloo over zero-copy
// CPU aliases of the npu tensors (device memory is host memory), and its
// works and futures hand the npu tensors back. What Gloo lacks (PREMUL_SUM,
// AVG) is rewritten; a cheap cross-rank fingerprint check (CollectiveCheck.h)
// turns mismatched collectives, which would make Gloo abort the process, into
// errors.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "distributed/CollectiveCheck.h"

namespace torch_npu::distributed {

// Gloo is created by PyTorch's own Python binding (its headers are not
// shipped with the wheel); torch_npu.distributed installs this factory.
using GlooFactory = std::function<c10::intrusive_ptr<c10d::Backend>(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, std::chrono::milliseconds timeout)>;
void set_gloo_factory(GlooFactory factory);

class ProcessGroupHCCL : public c10d::Backend {
 public:
  struct Options : c10d::Backend::Options {
    explicit Options(bool is_high_priority_stream = false);
    bool is_high_priority_stream;
    std::string group_id;
    std::map<std::string, std::string> hccl_config;
    int64_t op_timeout = 0;  // ms; 0 = the group timeout
  };

  ProcessGroupHCCL(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                   c10::intrusive_ptr<Options> options);
  ~ProcessGroupHCCL() override;

  const std::string getBackendName() const override { return "hccl"; }
  c10::intrusive_ptr<c10d::Backend::Options> getBackendOptions() override { return options_; }
  c10::intrusive_ptr<Options> options() const { return options_; }
  bool supportsSplitting() const override { return true; }
  bool supportsCoalescing() const override { return true; }
  void setTimeout(std::chrono::milliseconds timeout) override;

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_split_sizes,
                                               std::vector<int64_t>& input_split_sizes,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override;
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return seq_.load(); }
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<c10d::Backend::Options>& opts) override;
  void eagerConnectSingleDevice(at::Device device) override {}
  void abort() override;
  void shutdown() override;

  // The Gloo backend carrying the data (tests and diagnostics).
  c10::intrusive_ptr<c10d::Backend> gloo() const { return gloo_; }
  // Fingerprint checks of collective calls (on by default).
  bool collective_check() const { return check_; }
  // How many collectives were fingerprinted (tests and diagnostics).
  uint64_t fingerprints() const { return fingerprints_.load(); }
  // Python's _collective_check: True = check every collective, False = none.
  void set_collective_check(bool on) {
    check_ = on && checker_;
    check_mode_ = check_ ? CheckMode::ALL : CheckMode::OFF;
  }

 private:
  struct Call;  // one collective: its name, npu tensors and post-processing
  c10::intrusive_ptr<c10d::Work> launch(Call& call, const std::function<c10::intrusive_ptr<c10d::Work>()>& start);
  // Exchanges fingerprints (and an optional small payload); returns every rank's packet.
  at::Tensor check_fingerprint(const Call& call, const at::Tensor& payload = at::Tensor());
  bool fits_fingerprint(const std::vector<at::Tensor>& tensors, const c10d::ReduceOp& op) const;
  c10::intrusive_ptr<c10d::Work> allreduce_small(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts);
  // The one body of allreduce, allreduce_coalesced and reduce (root -1: every rank gets the result).
  template <typename Opts, typename Start>
  c10::intrusive_ptr<c10d::Work> reduce_like(c10d::OpType type, std::vector<at::Tensor>& tensors, const Opts& opts,
                                             int64_t root, Start start);

  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<Options> options_;
  c10::intrusive_ptr<c10d::Backend> gloo_;
  c10::intrusive_ptr<c10d::Backend> checker_;  // a second Gloo group for fingerprints
  std::atomic<uint64_t> seq_{0};
  uint64_t split_count_ = 0;  // splits of this group so far (same on every rank)
  bool check_ = true;  // a checker group exists and fingerprints may be exchanged
  CheckMode check_mode_ = CheckMode::AUTO;
  std::atomic<uint64_t> fingerprints_{0};
  bool coalescing_ = false;
  std::vector<c10::intrusive_ptr<c10d::Work>> coalesced_;  // works of the open coalesced block
};

}  // namespace torch_npu::distributed
