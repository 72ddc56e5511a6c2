// The C++ core's view of torch_npu's settings. The core never reads the
// environment: torch_npu._settings (Python, the one registry of environment
// variables) parses and validates them and hands the values over at import
// (torch_npu._C._set_core_settings). Values are canonical strings (flags
// "0"/"1", integers in range, sizes in bytes, id lists "a,b"), so readers here
// convert without re-validating. A name that was not handed over is unset.
#pragma once

#include <map>
#include <optional>
#include <string>

namespace torch_npu::settings {

void set_all(std::map<std::string, std::string> values, bool interactive);
std::optional<std::string> get(const std::string& name);
// A "0"/"1" setting; `dflt` when unset.
bool flag(const std::string& name, bool dflt);
// Python is interactive (REPL): the error suffix is dropped, as with TORCH_NPU_COMPACT_ERROR_OUTPUT=1.
bool interactive();

}  // namespace torch_npu::settings
