#include "core/Settings.h"

#include <mutex>

namespace torch_npu::settings {
namespace {
std::mutex g_mu;
std::map<std::string, std::string>* g_values = new std::map<std::string, std::string>();  // leaked: read at exit
bool g_interactive = false;
}  // namespace

void set_all(std::map<std::string, std::string> values, bool interactive) {
  std::lock_guard<std::mutex> g(g_mu);
  *g_values = std::move(values);
  g_interactive = interactive;
}

std::optional<std::string> get(const std::string& name) {
  std::lock_guard<std::mutex> g(g_mu);
  auto it = g_values->find(name);
  if (it == g_values->end()) return std::nullopt;
  return it->second;
}

bool flag(const std::string& name, bool dflt) {
  auto v = get(name);
  return v ? *v == "1" : dflt;
}

bool interactive() {
  std::lock_guard<std::mutex> g(g_mu);
  return g_interactive;
}

}  // namespace torch_npu::settings
