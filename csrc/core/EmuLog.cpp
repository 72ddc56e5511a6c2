#include "core/EmuLog.h"

#include <atomic>
#include <climits>

namespace torch_npu::log {
namespace {

std::atomic<Sink> g_sink{nullptr};
std::atomic<int> g_levels[NUM_COMPONENTS] = {INT_MAX, INT_MAX, INT_MAX, INT_MAX, INT_MAX};

}  // namespace

void set_sink(Sink sink) { g_sink.store(sink); }
void set_level(Component c, int level) { g_levels[c].store(level); }

bool enabled(Component c, int level) {
  return level >= g_levels[c].load(std::memory_order_relaxed) && g_sink.load(std::memory_order_relaxed) != nullptr;
}

void emit(Component c, int level, const std::string& message) {
  if (!enabled(c, level)) return;
  Sink sink = g_sink.load();
  if (sink) sink(c, level, message);
}

const char* component_name(Component c) {
  static const char* names[NUM_COMPONENTS] = {"device", "memory", "dispatch", "distributed", "env"};
  return names[c];
}

Deferred::~Deferred() {
  for (const auto& r : records_) emit(r.component, r.level, r.message);
}

void Deferred::add(Component c, int level, std::string message) {
  if (enabled(c, level)) records_.push_back({c, level, std::move(message)});
}

}  // namespace torch_npu::log
