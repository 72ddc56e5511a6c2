"""``schedule``: which profiler action each step gets (torch_npu's own enum)."""
from enum import Enum

__all__ = ["ProfilerAction", "Schedule"]


class ProfilerAction(Enum):
    NONE = 0
    WARMUP = 1
    RECORD = 2
    RECORD_AND_SAVE = 3


def _check_non_negative(name: str, value, default: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        print(f"[WARNING] Invalid parameter {name}, reset it to {default}.")
        return default
    return value


class Schedule:
    """wait/warmup/active steps per cycle, ``repeat`` cycles (0 = forever),
    after ``skip_first`` steps; ``skip_first_wait=1`` drops the first cycle's wait."""

    def __init__(self, wait: int, active: int, warmup: int = 0, repeat: int = 0, skip_first: int = 0,
                 skip_first_wait: int = 0) -> None:
        self.wait = _check_non_negative("wait", wait, 0)
        self.active = _check_non_negative("active", active, 1)
        if self.active == 0:
            print("[WARNING] Invalid parameter active, reset it to 1.")
            self.active = 1
        self.warmup = _check_non_negative("warmup", warmup, 0)
        self.repeat = _check_non_negative("repeat", repeat, 0)
        self.skip_first = _check_non_negative("skip_first", skip_first, 0)
        self.skip_first_wait = skip_first_wait if skip_first_wait in (0, 1) else 0

    def __call__(self, step: int) -> ProfilerAction:
        if step < 0:
            raise ValueError("Invalid parameter step, which must be not less than 0.")
        if step < self.skip_first:
            return ProfilerAction.NONE
        step -= self.skip_first
        if self.skip_first_wait:
            step += self.wait   # the first cycle starts at its warmup
        cycle = self.wait + self.warmup + self.active
        if self.repeat > 0 and step // cycle >= self.repeat:
            return ProfilerAction.NONE
        pos = step % cycle
        if pos < self.wait:
            return ProfilerAction.NONE
        if pos < self.wait + self.warmup:
            return ProfilerAction.WARMUP
        return ProfilerAction.RECORD if pos < cycle - 1 else ProfilerAction.RECORD_AND_SAVE


def _default_schedule(_: int) -> ProfilerAction:
    """Without a schedule, every step records (saved at stop)."""
    return ProfilerAction.RECORD
