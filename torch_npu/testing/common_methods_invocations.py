"""OpInfo sample-input generators torch_npu adds to (or uses instead of) PyTorch's.

Same calling convention as ``torch.testing._internal.common_methods_invocations``:
``(op_info, device, dtype, requires_grad, **kwargs)``, yielding ``SampleInput``s.
"""
from functools import partial

from torch.testing import make_tensor
from torch.testing._internal import common_methods_invocations as _torch_cmi

__all__ = ["sample_inputs_normal_tensor_second", "sample_inputs_median_custom"]


def sample_inputs_normal_tensor_second(self, device, dtype, requires_grad, **kwargs):
    """``torch.normal(mean, std)`` with a tensor mean and a scalar or tensor std (non-negative tensors)."""
    # (mean shape, std value or shape, kwargs)
    cases = [
        ([3, 4], 0.3, {}),
        ([3, 55], 0, {}),
        ([5, 6, 7, 8], [5, 6, 7, 8], {}),
    ]
    return _torch_cmi.sample_inputs_normal_common(self, device, dtype, requires_grad, cases, **kwargs)


def sample_inputs_median_custom(self, device, dtype, requires_grad, **kwargs):
    """``median``: two empty inputs first (a dimension of size 0 either side), then PyTorch's reduction samples."""
    make_arg = partial(make_tensor, device=device, dtype=dtype, requires_grad=requires_grad)
    for shape in ((2, 0), (0, 2)):
        yield _torch_cmi.SampleInput(make_arg(shape))
    yield from _torch_cmi.sample_inputs_reduction(self, device, dtype, requires_grad, **kwargs)
