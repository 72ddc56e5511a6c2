#include "core/NPUException.h"

#include <unistd.h>

#include <cstdio>
#include <string>
#include <ctime>

#include "core/Settings.h"
#include "runtime/AclRuntime.h"

namespace torch_npu {
namespace {
const char* sub_name(SubModule s) {
  switch (s) {
    case SubModule::PTA: return "PTA";
    case SubModule::OPS: return "OPS";
    case SubModule::DIST: return "DIST";
    case SubModule::GRAPH: return "GRAPH";
    case SubModule::PROF: return "PROF";
    case SubModule::UNKNOWN: break;
  }
  return "UNKNOWN";
}
const char* code_text(ErrCode c) {
  switch (c) {
    case ErrCode::SUC: return "success";
    case ErrCode::PARAM: return "invalid parameter";
    case ErrCode::TYPE: return "invalid type";
    case ErrCode::VALUE: return "invalid value";
    case ErrCode::PTR: return "invalid pointer";
    case ErrCode::INTERNAL: return "internal error";
    case ErrCode::MEMORY: return "memory error";
    case ErrCode::NOT_SUPPORT: return "feature not supported";
    case ErrCode::NOT_FOUND: return "resource not found";
    case ErrCode::UNAVAIL: return "resource unavailable";
    case ErrCode::SYSCALL: return "system call failed";
    case ErrCode::TIMEOUT: return "timeout error";
    case ErrCode::PERMISSION: return "permission error";
    case ErrCode::ACL: return "call acl api failed";
    case ErrCode::HCCL: return "call hccl api failed";
    case ErrCode::GE: return "call ge api failed";
    case ErrCode::EXCEPTION: break;
  }
  return "applicaiton exception";
}
}  // namespace

std::string format_error_code(SubModule sub, ErrCode code) {
  // The one formatter of the suffix: Python's pta_error() & co. call it too
  // (torch_npu._C._format_error_code). Settings come from torch_npu._settings.
  if (settings::flag("TORCH_NPU_COMPACT_ERROR_OUTPUT", false) || settings::interactive()) return "";
  char tbuf[32];
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  std::strftime(tbuf, sizeof(tbuf), "%Y-%m-%d-%H:%M:%S", &tm);
  const auto rank_setting = settings::get("RANK");
  const int rank = rank_setting ? std::stoi(*rank_setting) : -1;  // validated 0..INT32_MAX
  char buf[256];
  std::snprintf(buf, sizeof(buf), "\n[ERROR] %s (PID:%d, Device:%d, RankID:%d) ERR%02d%03d %s %s",
                tbuf, static_cast<int>(getpid()), acl_emu::current_device_or_default(), rank,
                static_cast<int>(sub), static_cast<int>(code), sub_name(sub), code_text(code));
  return buf;
}

}  // namespace torch_npu
