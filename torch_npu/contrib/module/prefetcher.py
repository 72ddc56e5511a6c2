"""Prefetch the next (input, target) batch to the npu on a side stream while the current one runs."""
import torch

__all__ = []


class Prefetcher(object):
    """Wraps a loader yielding ``(input, target)``; ``next()`` returns the npu pair, ``(None, None)``
    once the loader is exhausted."""

    def __init__(self, loader, stream=None):
        self.loader = iter(loader)
        self.stream = stream if stream is not None else torch.npu.Stream()
        self.preload()

    def preload(self):
        try:
            self.next_input, self.next_target = next(self.loader)
        except StopIteration:
            self.next_input = None
            self.next_target = None
            return
        with torch.npu.stream(self.stream):
            self.next_input = self.next_input.npu(non_blocking=True)
            self.next_target = self.next_target.npu(non_blocking=True)

    def next(self):
        torch.npu.current_stream().wait_stream(self.stream)
        next_input, next_target = self.next_input, self.next_target
        if next_target is not None:
            self.preload()
        return next_input, next_target
