// torch_npu's error suffix: "\n[ERROR] <time> (PID:…, Device:…, RankID:…)
// ERR<sub><code> <SUB> <text>", dropped when TORCH_NPU_COMPACT_ERROR_OUTPUT=1.
#pragma once

#include <c10/util/Exception.h>
#include <string>

namespace torch_npu {

enum class SubModule { PTA = 0, OPS = 1, DIST = 2, GRAPH = 3, PROF = 4, UNKNOWN = 99 };
enum class ErrCode {
  SUC = 0, PARAM = 1, TYPE = 2, VALUE = 3, PTR = 4, INTERNAL = 5, MEMORY = 6,
  NOT_SUPPORT = 7, NOT_FOUND = 8, UNAVAIL = 9, SYSCALL = 10, TIMEOUT = 11,
  PERMISSION = 12, ACL = 100, HCCL = 200, GE = 300, EXCEPTION = 999
};

// The one formatter of the suffix, for C++ and Python (torch_npu._C._format_error_code,
// called by torch_npu.utils._error_code). "" when TORCH_NPU_COMPACT_ERROR_OUTPUT=1
// or Python is interactive.
std::string format_error_code(SubModule sub, ErrCode code);

inline std::string PTA_ERROR(ErrCode c) { return format_error_code(SubModule::PTA, c); }
inline std::string OPS_ERROR(ErrCode c) { return format_error_code(SubModule::OPS, c); }

}  // namespace torch_npu

// Fail like torch_npu's NPU_CHECK_ERROR on a failed emulated ACL call.
#define NPU_CHECK_ERROR(expr)                                                   \
  do {                                                                          \
    auto __err = (expr);                                                        \
    TORCH_CHECK(__err == 0, __func__, ":", __FILE__, ":", __LINE__,             \
                " NPU function error: ", #expr, ", error code is ", __err,      \
                ::torch_npu::PTA_ERROR(::torch_npu::ErrCode::ACL),              \
                ::acl_emu::error_text(__err));                                  \
  } while (0)
