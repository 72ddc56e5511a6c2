"""``torch_npu.distributed.pipelining.pipeline``: PyTorch's pipeline splitter.

The stages it produces run on npu tensors unchanged (``PipelineStage`` and the
schedules move activations with send/recv on the ``hccl`` backend). torch_npu's
signature adds ``mode`` and ``atomic_units``; their semantics are not in the
reference material, so only their defaults are accepted (see
docs/distributed.md)."""
from torch.distributed.pipelining import pipeline as _torch_pipeline

__all__ = ["pipeline"]


def pipeline(module, mb_args, mb_kwargs=None, split_spec=None, split_policy=None, mode=None, atomic_units=None):
    """Split ``module`` into a ``Pipe`` as ``torch.distributed.pipelining.pipeline`` does."""
    if mode is not None or atomic_units is not None:
        raise NotImplementedError(
            "torch_npu.distributed.pipelining.pipeline: mode= and atomic_units= are not emulated "
            f"(got mode={mode!r}, atomic_units={atomic_units!r}); leave them at None.")
    return _torch_pipeline(module, mb_args, mb_kwargs=mb_kwargs, split_spec=split_spec, split_policy=split_policy)
