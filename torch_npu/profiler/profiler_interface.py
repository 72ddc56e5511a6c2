"""Profiler activities: ``ProfilerActivity.CPU`` (host ops) and ``.NPU`` (the device timeline)."""
from enum import Enum

__all__ = ["supported_activities"]


class ProfilerActivity(Enum):
    CPU = 0
    NPU = 1


def supported_activities() -> set:
    return {ProfilerActivity.CPU, ProfilerActivity.NPU}


def normalize_activities(activities) -> set:
    """Accept torch_npu's and torch.profiler's activity enums (NPU == PrivateUse1);
    anything else is dropped with the real 'Invalid parameter activities' warning."""
    if activities is None:
        return supported_activities()
    chosen = set()
    for activity in activities:
        name = getattr(activity, "name", None)
        if name in ("CPU", "NPU"):
            chosen.add(ProfilerActivity[name])
        elif name == "PrivateUse1":
            chosen.add(ProfilerActivity.NPU)
        else:
            print(f"[WARNING] Invalid parameter activities: {activity} is not supported, ignored.")
    if not chosen:
        print("[WARNING] Invalid parameter activities, reset it to default.")
        return supported_activities()
    return chosen
