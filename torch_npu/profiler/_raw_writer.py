"""Writes one recording as torch_npu's raw layout: profiler_info.json,
profiler_metadata.json, FRAMEWORK/ (host trace + device timeline), logs/."""
import json
import os

import torch

import torch_npu
from .analysis._profile_data import DEVICE_TIMELINE, FRAMEWORK, HOST_TRACE, PROFILER_INFO, PROFILER_METADATA


def write_raw(prof_dir: str, recording, common_config: dict, experimental_config: dict, metadata: dict) -> None:
    os.makedirs(os.path.join(prof_dir, FRAMEWORK), exist_ok=True)
    os.makedirs(os.path.join(prof_dir, "logs"), exist_ok=True)
    info = {
        "config": {"common_config": common_config, "experimental_config": experimental_config},
        "start_info": {"start_ns": recording.start_ns},
        "end_info": {"end_ns": recording.end_ns},
        "torch_npu_version": torch_npu.__version__,
        "torch_version": torch.__version__,
        "cann_version": torch.version.cann,
        "device_name": torch_npu.emulator.device_name(),
        "memory_per_device": torch_npu.emulator.memory_per_device(),
        "emulated": True,
    }
    rank = _rank()
    info_name = PROFILER_INFO if rank is None else f"profiler_info_{rank}.json"
    _dump(os.path.join(prof_dir, info_name), info)
    if info_name != PROFILER_INFO:     # the analysis reads one name
        _dump(os.path.join(prof_dir, PROFILER_INFO), info)
    _dump(os.path.join(prof_dir, PROFILER_METADATA), metadata)
    _dump(os.path.join(prof_dir, FRAMEWORK, HOST_TRACE), recording.host_trace)
    _dump(os.path.join(prof_dir, FRAMEWORK, DEVICE_TIMELINE), recording.device_events)


def _rank():
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return None


def _dump(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(obj))     # dumps uses the C encoder
