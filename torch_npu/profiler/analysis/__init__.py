"""Offline analysis of torch_npu profiler data (the ``*_ascend_pt`` directories).

``summary(path)`` returns (and ``print_summary`` prints) the report written as
ASCEND_PROFILER_OUTPUT/summary.txt: top ops by device time, CPU-fallback ops,
device idle / input-wait share per step, peak memory per device.
"""
import os

from ._parser import OUTPUT_DIR, parse_one, profiler_dirs


def summary(profiler_path: str) -> str:
    texts = []
    for prof_dir in profiler_dirs(profiler_path):
        path = os.path.join(prof_dir, OUTPUT_DIR, "summary.txt")
        if not os.path.exists(path):
            parse_one(prof_dir)
        with open(path, encoding="utf-8") as f:
            texts.append(f"# {os.path.basename(prof_dir)}\n" + f.read())
    return "\n".join(texts)


def print_summary(profiler_path: str) -> None:
    print(summary(profiler_path), end="")
