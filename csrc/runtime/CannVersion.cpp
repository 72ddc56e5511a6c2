// The emulated CANN release. One version for every package of the toolkit;
// the driver carries its own numbering.
#include <array>
#include <regex>
#include <string>

#include <c10/util/Exception.h>

#include "runtime/AclRuntime.h"

namespace acl_emu {
namespace {

constexpr const char* kCann = "8.3.RC1";
constexpr const char* kDriver = "25.3.rc1";

// Sort key of a version string; a string that is not a version sorts lowest.
// Tiers: 0 = a.b.Tg, 1 = a.b.RCd (an alpha of RCd sorts just below it),
// 2 = a.b.c.
std::array<long, 5> version_key(const std::string& v) {
  static const std::regex release(R"((\d+)\.(\d+)\.(\d+))");
  static const std::regex rc(R"((\d+)\.(\d+)\.RC(\d+))", std::regex::icase);
  static const std::regex rc_alpha(R"((\d+)\.(\d+)\.RC(\d+)\.alpha(\d+))", std::regex::icase);
  static const std::regex test(R"((\d+)\.(\d+)\.T(\d+))", std::regex::icase);
  std::smatch m;
  auto n = [&](int i) { return std::stol(m[i].str()); };
  if (std::regex_match(v, m, release)) return {n(1), n(2), 2, n(3), 0};
  if (std::regex_match(v, m, rc)) return {n(1), n(2), 1, n(3), 1L << 30};
  if (std::regex_match(v, m, rc_alpha)) return {n(1), n(2), 1, n(3), n(4)};
  if (std::regex_match(v, m, test)) return {n(1), n(2), 0, n(3), 0};
  return {-1, -1, -1, -1, -1};
}

bool is_version(const std::string& v) { return version_key(v)[0] >= 0;
}

}  // namespace

std::string cann_version(const std::string& module) {
  static const std::array<const char*, 7> toolkit = {"CANN", "RUNTIME", "COMPILER", "HCCL",
                                                     "TOOLKIT", "OPP", "OPP_KERNEL"};
  for (const char* name : toolkit) {
    if (module == name) return kCann;
  }
  if (module == "DRIVER") return kDriver;
  return "";
}

bool is_gte_cann_version(const std::string& version, const std::string& module) {
  TORCH_CHECK(is_version(version), "Invalid CANN version '", version,
              "': expected a.b.c, a.b.RCd, a.b.Tg or a.b.RCd.alphaf");
  const std::string current = cann_version(module);
  if (current.empty()) return false;
  return version_key(current) >= version_key(version);
}

}  // namespace acl_emu
