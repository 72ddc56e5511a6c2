"""``FlopsCounter``: count the floating-point operations of matmul-class ops.

Built on ``torch.utils.flop_counter.FlopCounterMode``, which counts the same
ops (mm, bmm, addmm, convolution, attention) with the same formulas whatever
the device. ``get_flops()`` returns ``[recorded_flops, total_flops]``: flops
counted while started and not paused, and flops since the first start
(including paused periods)."""
from torch.utils.flop_counter import FlopCounterMode

__all__ = ["FlopsCounter"]


class FlopsCounter:
    def __init__(self):
        self._mode = None
        self._paused = False
        self._recorded = 0
        self._total = 0

    def _collect(self):
        if self._mode is not None:
            flops = self._mode.get_total_flops()
            self._mode.__exit__(None, None, None)
            self._mode = None
            self._total += flops
            if not self._paused:
                self._recorded += flops

    def _open(self):
        self._mode = FlopCounterMode(display=False)
        self._mode.__enter__()

    def start(self):
        self._collect()
        self._recorded = self._total = 0
        self._paused = False
        self._open()

    def stop(self):
        self._collect()
        self._paused = False

    def pause(self):
        self._collect()
        self._paused = True
        self._open()

    def resume(self):
        self._collect()
        self._paused = False
        self._open()

    def get_flops(self):
        live = self._mode.get_total_flops() if self._mode is not None else 0
        return [self._recorded + (0 if self._paused else live), self._total + live]
