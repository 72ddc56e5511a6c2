"""Runs a training script unchanged, then records what only the emulated NPU knows.

`torch_npu_run ... demo_worker.py llama_cuda/train.py <its args>`: the CUDA
script runs as `__main__`; afterwards this rank's CPU-fallback report
(`torch_npu.emulator.fallback_report()`) goes to
`$DEMO_FALLBACK_DIR/fallback_rank<r>.json`.  A real NPU has no such report:
its ops just fall back, so this lives beside the script, not in it.
"""
import json
import os
import runpy
import sys


def main():
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    runpy.run_path(script, run_name="__main__")
    import torch_npu
    out_dir = os.environ["DEMO_FALLBACK_DIR"]
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"fallback_rank{os.environ['RANK']}.json"), "w") as f:
        json.dump(torch_npu.emulator.fallback_report(), f)


if __name__ == "__main__":
    main()
