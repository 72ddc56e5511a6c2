"""``torch.Generator`` and ``torch.Event`` stand-ins that turn a CUDA device into the NPU.

They are subclasses (so C++ accepts what they build) whose metaclass answers
``isinstance``/``issubclass`` for the original class: a generator made by torch itself
(``torch.default_generator``, ``torch.npu.default_generators``) is still an instance of the
patched ``torch.Generator``.
"""
import torch

from torch_npu.contrib._transfer.rewrite import _device_of, record


def device_proxy(original):
    meta = type(original)

    class _ProxyMeta(meta):
        def __instancecheck__(cls, obj):
            return isinstance(obj, original)

        def __subclasscheck__(cls, sub):
            return issubclass(sub, original)

    def __new__(cls, *args, **kwargs):
        args, kwargs = _rewrite(args, kwargs)
        return original.__new__(cls, *args, **kwargs)

    def __init__(self, *args, **kwargs):
        args, kwargs = _rewrite(args, kwargs)
        original.__init__(self, *args, **kwargs)

    def _rewrite(args, kwargs):
        if args:
            repl = _device_of(args[0], False)
            if repl is not None:
                record(f"torch.{original.__name__}", args[0])
                args = (repl,) + tuple(args[1:])
        for key in ("device", "device_type"):
            if key in kwargs:
                repl = _device_of(kwargs[key], False)
                if repl is not None:
                    record(f"torch.{original.__name__}", kwargs[key])
                    kwargs = dict(kwargs, **{key: repl})
        return args, kwargs

    body = {"__new__": __new__, "__module__": "torch", "__doc__": original.__doc__}
    # object.__init__ rejects arguments; only pass them on to a real initialiser.
    if original.__init__ is not object.__init__:
        body["__init__"] = __init__
    return _ProxyMeta(original.__name__, (original,), body)


def install():
    torch.Generator = device_proxy(torch._C.Generator)
    torch.Event = device_proxy(torch.Event)
