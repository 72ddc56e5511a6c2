// Logging from the C++ core into torch_npu's Python loggers (TORCH_NPU_LOGS,
// ASCEND_GLOBAL_LOG_LEVEL): the Python side sets one threshold per
// component and a sink; a disabled record costs one relaxed atomic load.
// Records must be emitted with no core lock held (the sink takes the GIL).
#pragma once

#include <string>
#include <vector>

namespace torch_npu::log {

enum Component { DEVICE = 0, MEMORY = 1, DISPATCH = 2, DISTRIBUTED = 3, ENV = 4, NUM_COMPONENTS = 5 };
// Python logging levels.
enum Level { DEBUG = 10, INFO = 20, WARNING = 30, ERROR = 40 };

using Sink = void (*)(Component component, int level, const std::string& message);

void set_sink(Sink sink);
void set_level(Component component, int level);
bool enabled(Component component, int level);
void emit(Component component, int level, const std::string& message);
const char* component_name(Component component);

// Collects records while a lock is held and emits them when it goes out of
// scope (declare it before the lock guard).
class Deferred {
 public:
  Deferred() = default;
  ~Deferred();
  Deferred(const Deferred&) = delete;
  Deferred& operator=(const Deferred&) = delete;
  void add(Component component, int level, std::string message);

 private:
  struct Record {
    Component component;
    int level;
    std::string message;
  };
  std::vector<Record> records_;
};

}  // namespace torch_npu::log
