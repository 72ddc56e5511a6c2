// The cross-rank fingerprint check of ProcessGroupHCCL's collectives.
//
// Gloo aborts the process when ranks call mismatched collectives. Before a
// collective, every rank can publish a fixed-size packet (sequence number,
// op, dtype, sizes, root, reduce op) on a second Gloo group and compare it
// with its peers', turning a mismatch into a DistBackendError that names both
// sides. The packet has room for a small payload, so a small all_reduce can
// ride on its own check (ProcessGroupHCCL::allreduce_small).
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <exception>
#include <string>
#include <vector>

namespace torch_npu::distributed {

// Names shared by the collective forwarding and the check's messages.
std::string op_name(c10d::OpType t);
const char* reduce_name(int64_t op);
std::string exception_text(const std::exception_ptr& e);

// TORCH_NPU_EMU_COLLECTIVE_CHECK (torch_npu._settings): 1/all = every
// collective, 0 = never, auto (default) = where it is cheap;
// TORCH_DISTRIBUTED_DEBUG=DETAIL asks for all.
enum class CheckMode { OFF, AUTO, ALL };
CheckMode check_mode_from_settings();

// Whether collective number `seq` is checked under `mode`. Depends only on
// what every rank of a healthy job agrees on (the sequence number; sizes only
// for ops whose sizes must match anyway), so ranks never disagree.
bool should_check(CheckMode mode, uint64_t seq, bool shapes_must_match, const std::vector<at::Tensor>& signature);

// Packet layout: kFingerprintFields int64 fields, then kPayloadBytes of payload.
constexpr int kFingerprintFields = 8;
constexpr int64_t kPayloadBytes = 1024;
constexpr int64_t kPacketWords = kFingerprintFields + kPayloadBytes / 8;

struct Fingerprint {
  uint64_t seq;
  c10d::OpType type;
  const std::vector<at::Tensor>& signature;  // tensors whose dtype and sizes are compared
  bool shapes_must_match;
  int64_t root;
  int64_t reduce;
};

// Exchanges `fp` (and an optional payload of at most kPayloadBytes) with every
// rank of `checker`; returns the gathered packets (size * kPacketWords int64).
// Throws DistBackendError on a mismatch or when a peer does not answer.
at::Tensor exchange_fingerprints(c10d::Backend& checker, int rank, int size, const std::string& group,
                                 const Fingerprint& fp, const at::Tensor& payload);

}  // namespace torch_npu::distributed
