"""Tracing of nn.LSTM / GRU / RNN on npu under torch.compile.

In eager mode the npu kernels of ``aten::lstm`` / ``gru`` / ``rnn_tanh`` /
``rnn_relu`` (``csrc/aten/RnnKernels.cpp``, registered for
AutogradPrivateUse1) run the CPU implementation. While torch.compile traces
(the Python dispatcher is on), those ops must instead decompose into
traceable ATen ops with autograd, as they do for every other device: the
Python dispatcher would otherwise pick the explicit npu kernel. So the
decompositions torch registers for the ``Autograd`` alias key are also
registered for ``AutogradPrivateUse1``; eager calls never see them.
"""
import torch
import torch._decomp.decompositions  # noqa: F401  (registers the RNN decompositions)
from torch._C import DispatchKey

__all__ = []

_OVERLOADS = ("lstm.input", "lstm.data", "gru.input", "gru.data", "rnn_tanh.input", "rnn_tanh.data",
              "rnn_relu.input", "rnn_relu.data")


def _install():
    """Register torch's Autograd-key RNN decompositions for AutogradPrivateUse1 too (idempotent)."""
    for name in _OVERLOADS:
        packet, overload = name.split(".")
        op = getattr(getattr(torch.ops.aten, packet), overload)
        decomposition = op.py_kernels.get(DispatchKey.Autograd)
        if decomposition is not None and DispatchKey.AutogradPrivateUse1 not in op.py_kernels:
            op.py_impl(DispatchKey.AutogradPrivateUse1)(decomposition)
