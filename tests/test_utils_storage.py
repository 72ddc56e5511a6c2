"""torch_npu.utils.storage._rebuild_npu_tensor: the unpickling hook of old torch_npu files."""
import collections
import io
import warnings

import torch

import torch_npu
from torch_npu.utils.storage import _rebuild_npu_tensor


def _typed_storage(t):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TypedStorage is deprecated; old files hold one
        return t.storage()


def test_rebuild_gives_the_view_with_grad_flag_and_hooks():
    x = torch.arange(6, dtype=torch.float32).npu()
    hooks = collections.OrderedDict()
    t = _rebuild_npu_tensor(_typed_storage(x), 1, (2, 2), (2, 1), True, hooks, False)
    assert t.device == x.device and t.requires_grad and t._backward_hooks is hooks
    assert t.data_ptr() == x.data_ptr() + 4
    torch.testing.assert_close(t.cpu(), torch.tensor([[1.0, 2.0], [3.0, 4.0]]), rtol=0, atol=0)


class _OldNpuTensor:
    """Pickles as old torch_npu pickled an npu tensor: a call of _rebuild_npu_tensor."""

    def __init__(self, t):
        self.t = t

    def __reduce__(self):
        return (_rebuild_npu_tensor, (_typed_storage(self.t), 0, tuple(self.t.shape), self.t.stride(), False,
                                      collections.OrderedDict(), False))


def test_old_file_loads_with_weights_only_once_listed_as_safe():
    x = torch.randn(3, 4).npu()
    buf = io.BytesIO()
    torch.save({"w": _OldNpuTensor(x)}, buf, _use_new_zipfile_serialization=True)
    buf.seek(0)
    with torch.serialization.safe_globals([torch_npu.utils.storage._rebuild_npu_tensor]):
        loaded = torch.load(buf, weights_only=True)
    assert loaded["w"].device == x.device
    torch.testing.assert_close(loaded["w"].cpu(), x.cpu(), rtol=0, atol=0)
    assert torch_npu.utils.storage.__all__ == []
