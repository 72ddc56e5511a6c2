#include "distributed/CollectiveCheck.h"

#include <c10/util/Exception.h>

#include <sstream>

#include "core/Settings.h"

namespace torch_npu::distributed {

std::string op_name(c10d::OpType t) {
  switch (t) {
    case c10d::OpType::BROADCAST: return "broadcast";
    case c10d::OpType::ALLREDUCE: return "allreduce";
    case c10d::OpType::ALLREDUCE_COALESCED: return "allreduce_coalesced";
    case c10d::OpType::REDUCE: return "reduce";
    case c10d::OpType::ALLGATHER: return "allgather";
    case c10d::OpType::_ALLGATHER_BASE: return "allgather_into_tensor";
    case c10d::OpType::ALLGATHER_COALESCED: return "allgather_coalesced";
    case c10d::OpType::GATHER: return "gather";
    case c10d::OpType::SCATTER: return "scatter";
    case c10d::OpType::REDUCE_SCATTER: return "reduce_scatter";
    case c10d::OpType::_REDUCE_SCATTER_BASE: return "reduce_scatter_tensor";
    case c10d::OpType::ALLTOALL_BASE: return "all_to_all_single";
    case c10d::OpType::ALLTOALL: return "all_to_all";
    case c10d::OpType::SEND: return "send";
    case c10d::OpType::RECV: return "recv";
    case c10d::OpType::RECVANYSOURCE: return "recv_anysource";
    case c10d::OpType::BARRIER: return "barrier";
    case c10d::OpType::COALESCED: return "coalesced";
    default: return "collective";
  }
}

const char* reduce_name(int64_t op) {
  static const char* names[] = {"SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM"};
  return (op >= 0 && op <= 8) ? names[op] : "-";
}

std::string exception_text(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const c10::Error& err) {
    return err.what_without_backtrace();
  } catch (const std::exception& err) {
    return err.what();
  } catch (...) {
    return "unknown error";
  }
}

CheckMode check_mode_from_settings() {
  // Values validated by torch_npu._settings: "auto", "0" or "1"; OFF/INFO/DETAIL.
  const std::string mode = settings::get("TORCH_NPU_EMU_COLLECTIVE_CHECK").value_or("auto");
  if (mode == "0") return CheckMode::OFF;
  if (mode == "1") return CheckMode::ALL;
  return settings::get("TORCH_DISTRIBUTED_DEBUG").value_or("OFF") == "DETAIL" ? CheckMode::ALL : CheckMode::AUTO;
}

namespace {
// "Where it is cheap": the first collectives of a group, where a mis-launched
// or mis-resumed job desynchronises, and collectives whose payload dwarfs the
// check's one small round trip.
constexpr uint64_t kStartupChecks = 32;
constexpr int64_t kCheapCheckBytes = 32LL << 20;
}  // namespace

bool should_check(CheckMode mode, uint64_t seq, bool shapes_must_match, const std::vector<at::Tensor>& signature) {
  if (mode == CheckMode::ALL) return true;
  if (mode == CheckMode::OFF) return false;
  if (seq < kStartupChecks) return true;
  if (!shapes_must_match) return false;
  int64_t bytes = 0;
  for (const auto& t : signature) bytes += t.numel() * t.element_size();
  return bytes >= kCheapCheckBytes;
}

// Every exchange moves one fixed-size packet per rank, so that two ranks in
// different calls still send equal sizes and Gloo never sees a mismatch on
// the checker group.
at::Tensor exchange_fingerprints(c10d::Backend& checker, int rank, int size, const std::string& group,
                                 const Fingerprint& call, const at::Tensor& payload) {
  const uint64_t seq = call.seq;
  int64_t numel = 0, ndim = 0, hash = 1469598103934665603LL;
  int64_t dtype = -1;
  for (const auto& t : call.signature) {
    numel += t.numel();
    ndim += t.dim();
    dtype = static_cast<int64_t>(t.scalar_type());
    for (auto s : t.sizes()) hash = (hash ^ s) * 1099511628211LL;
  }
  if (!call.shapes_must_match) numel = ndim = hash = -1;
  at::Tensor mine = at::zeros({kPacketWords}, at::kLong);
  int64_t* m = mine.data_ptr<int64_t>();
  if (payload.defined()) {
    at::from_blob(m + kFingerprintFields, payload.sizes(), payload.options().device(at::kCPU)).copy_(payload);
  }
  const int64_t fields[kFingerprintFields] = {static_cast<int64_t>(seq), static_cast<int64_t>(call.type), dtype, numel,
                             ndim, hash, call.root, call.reduce};
  std::copy(fields, fields + kFingerprintFields, m);
  at::Tensor all = at::empty({size * kPacketWords}, at::kLong);
  try {
    checker._allgather_base(all, mine, c10d::AllgatherOptions())->wait();
  } catch (...) {
    C10_THROW_ERROR(DistBackendError,
                    "HCCL (emulated on Gloo): rank " + std::to_string(rank) + " of group '" +
                        group + "' could not agree with its peers on collective #" +
                        std::to_string(seq) + " (" + op_name(call.type) + "): " +
                        exception_text(std::current_exception()) +
                        ". A peer rank has probably exited or is stuck.");
  }
  const int64_t* a = all.data_ptr<int64_t>();
  auto describe = [&](int r) {
    const int64_t* f = a + r * kPacketWords;
    std::ostringstream os;
    os << "rank " << r << ": collective #" << f[0] << " " << op_name(static_cast<c10d::OpType>(f[1]));
    if (f[2] >= 0) os << " dtype=" << c10::toString(static_cast<c10::ScalarType>(f[2]));
    if (f[3] >= 0) os << " numel=" << f[3];
    if (f[6] >= 0) os << " root=" << f[6];
    if (f[7] >= 0) os << " op=" << reduce_name(f[7]);
    return os.str();
  };
  for (int r = 0; r < size; ++r) {
    const int64_t* f = a + r * kPacketWords;
    bool same = true;
    for (int i : {0, 1, 2, 6, 7}) same = same && f[i] == m[i];
    if (call.shapes_must_match && f[3] >= 0) same = same && f[3] == m[3] && f[4] == m[4] && f[5] == m[5];
    if (!same) {
      std::ostringstream os;
      os << "HCCL (emulated on Gloo): mismatched collectives in group '" << group << "': "
         << describe(rank) << " (this rank); " << describe(r)
         << ". Every rank must call the same collectives in the same order with matching tensors "
            "(set TORCH_NPU_EMU_COLLECTIVE_CHECK=0 to skip this check).";
      C10_THROW_ERROR(DistBackendError, os.str());
    }
  }
  return all;
}


}  // namespace torch_npu::distributed
