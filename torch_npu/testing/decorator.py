"""Parametrisation decorators of torch_npu.testing.

``@Dtypes(torch.float, torch.half)`` and ``@Formats(0, 2)`` annotate a test
method ``def test_x(self, device, dtype, npu_format)``; ``@instantiate_tests``
on the class replaces it with one test per combination
(``test_x_npu_float32_0``…). Arguments a test does not take are not passed.
"""
import functools
import inspect

__all__ = ["Dtypes", "Formats", "instantiate_tests", "instantiate_ops_tests", "feed_data", "gen_op_input",
           "gen_ops_testcase"]


class _Parameter:
    attr = None

    def __init__(self, *args):
        self.values = args

    def __call__(self, fn):
        setattr(fn, self.attr, self.values)
        return fn


class Dtypes(_Parameter):
    attr = "_npu_test_dtypes"


class Formats(_Parameter):
    attr = "_npu_test_formats"


def _value_name(value):
    return str(value).replace("torch.", "")


def feed_data(func, new_name, *args, **kwargs):
    r"""A copy of test ``func`` named ``new_name`` with the given arguments bound."""
    @functools.wraps(func)
    def test(self):
        return func(self, *args, **kwargs)
    test.__name__ = new_name
    test.__qualname__ = new_name
    return test


def _expand(cls, name, func, device):
    dtypes = getattr(func, Dtypes.attr, (None,))
    formats = getattr(func, Formats.attr, (None,))
    params = inspect.signature(func).parameters
    for dtype in dtypes:
        for fmt in formats:
            kwargs = {}
            suffix = [device]
            if "device" in params:
                kwargs["device"] = device
            if dtype is not None:
                kwargs["dtype"] = dtype
                suffix.append(_value_name(dtype))
            if fmt is not None:
                kwargs["npu_format"] = fmt
                suffix.append(str(fmt))
            new_name = "_".join([name] + suffix)
            setattr(cls, new_name, feed_data(func, new_name, **kwargs))


def instantiate_tests(arg=None, **kwargs):
    r"""Class decorator (``@instantiate_tests`` or ``@instantiate_tests(device="npu")``)."""
    device = kwargs.get("device", "npu")

    def apply(cls):
        for name, func in list(vars(cls).items()):
            if not name.startswith("test") or not callable(func):
                continue
            params = inspect.signature(func).parameters
            if len(params) == 1 and not hasattr(func, Dtypes.attr) and not hasattr(func, Formats.attr):
                continue  # a plain test method
            delattr(cls, name)
            _expand(cls, name, func, device)
        return cls

    if isinstance(arg, type):
        return apply(arg)
    return apply


def gen_op_input(testcase, func, op_info):
    r"""Sample inputs of an OpInfo for ``func``'s dtype/device (first sample)."""
    samples = op_info.sample_inputs(testcase.device, testcase.dtype, requires_grad=False)
    return next(iter(samples))


def gen_ops_testcase(cls, func, name, keys, value, op_info):
    new_name = "_".join([name, op_info.name] + [str(v) for v in value])
    setattr(cls, new_name, feed_data(func, new_name, op_info, **dict(zip(keys, value))))


def instantiate_ops_tests(op_db):
    r"""Class decorator: one test per OpInfo in ``op_db`` for each ``test_*(self, op_info)``."""
    def apply(cls):
        for name, func in list(vars(cls).items()):
            if name.startswith("test") and callable(func) and "op_info" in inspect.signature(func).parameters:
                delattr(cls, name)
                for op in op_db:
                    gen_ops_testcase(cls, func, name, [], [], op)
        return cls
    return apply
