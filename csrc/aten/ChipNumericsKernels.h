// The npu kernels of chip-numerics mode (torch_npu.emulator.set_numerics("chip"),
// docs/numerics.md): the cube ops round their fp32 inputs before the CPU
// kernel runs. Python (torch_npu/emulator/_numerics.py) decides the rules and
// pushes their outcome here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace torch_npu::numerics {

// The two families of cube ops; each has its own switches.
enum class CubeFamily : int { Matmul = 0, Conv = 1 };

// What the cube ops of `family` do to fp32 inputs from now on: -1 keeps them,
// otherwise a CubeRounding value (0 HF32, 1 fp16). Throws for another value.
void set_family_rounding(CubeFamily family, int rounding);

// Installs (on=true) or removes the chip kernels: an IMPL library on the
// PrivateUse1 key that replaces the default npu kernels of the cube ops.
// Removed, the dispatcher runs the default kernels again, and exact mode has
// no chip code on its path. Idempotent.
void enable_chip_kernels(bool on);

// One line of the report: calls whose inputs were rounded, the kinds used
// (bit 0 HF32, bit 1 fp16), elements rounded and elements changed.
struct ChipOpCounts {
  std::string op;  // "mm", "mm.out", "convolution_overrideable", ...
  int64_t calls = 0;
  int kinds = 0;
  int64_t elements = 0;
  int64_t changed = 0;
};
// Every op with at least one counted call, in table order. Counts are
// atomics: a report taken while ops run on other threads may show a call
// half counted.
std::vector<ChipOpCounts> chip_report();
void reset_chip_report();

}  // namespace torch_npu::numerics
