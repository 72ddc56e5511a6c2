"""Activation ops: GELU variants, gated linear units (SwiGLU, GeGLU), SiLU, Mish."""
import torch
import torch.nn.functional as F

from torch_npu.op_plugin._common import acc, check
from torch_npu.op_plugin._registry import impl

__all__ = []

_FAST_GELU_K = 1.702


def _gelu_mode(op, approximate):
    check(approximate in ("none", "tanh"), op, "approximate must be 'none' or 'tanh', got %r", (approximate,))
    return approximate


def _halves(op, x, dim):
    check(x.dim() > 0, op, "input must have at least one dimension")
    size = x.shape[dim]
    check(size % 2 == 0, op, "the size of dim %d (%s) must be even", (dim, size))
    return x.chunk(2, dim)


# --------------------------------------------------------------------- GELU


@impl("npu_gelu")
def npu_gelu(self, *, approximate="none"):
    """GELU: ``0.5 * x * (1 + erf(x / sqrt(2)))``, or with ``approximate='tanh'``
    ``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))``."""
    return F.gelu(self, approximate=_gelu_mode("npu_gelu", approximate))


@impl("npu_gelu_backward")
def npu_gelu_backward(grad_output, self, *, approximate="none"):
    """``grad_output * d gelu(x) / dx`` for the chosen approximation."""
    return torch.ops.aten.gelu_backward(grad_output, self,
                                        approximate=_gelu_mode("npu_gelu_backward", approximate))


@impl("npu_gelu_mul")
def npu_gelu_mul(input, *, approximate="none"):
    """GELU-and-multiply: split the last dim in halves ``x1 = input[..., :d]``,
    ``x2 = input[..., d:]``; ``out = gelu(x1) * x2`` (last dim halved)."""
    mode = _gelu_mode("npu_gelu_mul", approximate)
    x1, x2 = _halves("npu_gelu_mul", input, -1)
    return (F.gelu(acc(x1), approximate=mode) * acc(x2)).to(input.dtype)


def _fast_gelu(x):
    xf = acc(x)
    ax = xf.abs()
    y = xf / (1 + torch.exp(-_FAST_GELU_K * ax)) * torch.exp((_FAST_GELU_K / 2) * (xf - ax))
    return y.to(x.dtype)


@impl("fast_gelu")
def fast_gelu(self):
    """Fast GELU: ``x / (1 + exp(-1.702 * |x|)) * exp(0.851 * (x - |x|))``
    (equal to ``x * sigmoid(1.702 * x)``, written so no exponent is positive)."""
    return _fast_gelu(self)


@impl("npu_fast_gelu")
def npu_fast_gelu(self):
    """Same as :func:`fast_gelu`: ``x / (1 + exp(-1.702|x|)) * exp(0.851(x - |x|))``."""
    return _fast_gelu(self)


@impl("npu_fast_gelu_backward")
def npu_fast_gelu_backward(grad, self):
    """Gradient of fast GELU: with ``e = exp(-1.702|x|)``,
    ``dx = grad * (e + 1.702 * x * e + exp(1.702 * (x - |x|))) / (1 + e)^2``."""
    xf = acc(self)
    ax = xf.abs()
    e = torch.exp(-_FAST_GELU_K * ax)
    d = (e + _FAST_GELU_K * xf * e + torch.exp(_FAST_GELU_K * (xf - ax))) / (1 + e).square()
    return (acc(grad) * d).to(self.dtype)


# ------------------------------------------------------------ gated units


@impl("npu_swiglu")
def npu_swiglu(self, dim=-1):
    """SwiGLU: ``a, b = x.chunk(2, dim)``; ``y = silu(a) * b = a * sigmoid(a) * b``
    (``dim`` halved). Computed in float32 for float16/bfloat16."""
    a, b = _halves("npu_swiglu", self, dim)
    return (F.silu(acc(a)) * acc(b)).to(self.dtype)


@impl("npu_swiglu_backward")
def npu_swiglu_backward(grad_output, self, dim=-1):
    """Gradient of :func:`npu_swiglu`: with ``s = sigmoid(a)``,
    ``da = g * b * s * (1 + a * (1 - s))``, ``db = g * a * s``; ``dx = cat(da, db, dim)``."""
    a, b = _halves("npu_swiglu_backward", self, dim)
    af, bf, g = acc(a), acc(b), acc(grad_output)
    s = torch.sigmoid(af)
    da = g * bf * s * (1 + af * (1 - s))
    db = g * af * s
    return torch.cat((da, db), dim).to(self.dtype)


def _geglu_mode(op, approximate):
    check(approximate in (0, 1), op, "approximate must be 0 (erf) or 1 (tanh), got %r", (approximate,))
    return "tanh" if approximate == 1 else "none"


@impl("npu_geglu")
def npu_geglu(self, dim=-1, approximate=1, activate_left=False):
    """GeGLU: split ``x`` in halves ``left, right`` along ``dim``; the activated half
    is ``gate = left if activate_left else right``, the other half is ``h``.
    ``gelu = GELU(gate)`` (``approximate``: 0 = erf, 1 = tanh) and ``y = h * gelu``.
    Returns ``(y, gelu)``, both with ``dim`` halved."""
    mode = _geglu_mode("npu_geglu", approximate)
    left, right = _halves("npu_geglu", self, dim)
    gate, h = (left, right) if activate_left else (right, left)
    g = F.gelu(acc(gate), approximate=mode)
    return (acc(h) * g).to(self.dtype), g.to(self.dtype)


@impl("npu_geglu_grad")
def npu_geglu_grad(grad_output, self, gelu, dim=-1, approximate=1, activate_left=False):
    """Gradient of :func:`npu_geglu` with respect to ``self``:
    ``dh = grad_output * gelu``, ``dgate = GELU'(gate) * grad_output * h``, placed back
    in the halves they came from."""
    mode = _geglu_mode("npu_geglu_grad", approximate)
    left, right = _halves("npu_geglu_grad", self, dim)
    gate, h = (left, right) if activate_left else (right, left)
    g = acc(grad_output)
    dh = g * acc(gelu)
    dgate = torch.ops.aten.gelu_backward(g * acc(h), acc(gate), approximate=mode)
    parts = (dgate, dh) if activate_left else (dh, dgate)
    return torch.cat(parts, dim).to(self.dtype)


# -------------------------------------------------------------- SiLU, Mish


@impl("npu_silu")
def npu_silu(self):
    """SiLU / Swish: ``x * sigmoid(x)``."""
    return F.silu(self)


@impl("npu_silu_")
def npu_silu_(self):
    """In-place SiLU: ``self = self * sigmoid(self)``; returns ``self``."""
    return F.silu(self, inplace=True)


@impl("npu_silu_backward")
def npu_silu_backward(grad_output, x0, x1):
    """Gradient of SiLU at the forward input ``x0``:
    ``grad_output * s * (1 + x0 * (1 - s))`` with ``s = sigmoid(x0)``
    (``x1``, the forward output, is not needed for the value)."""
    return torch.ops.aten.silu_backward(grad_output, x0)


@impl("npu_mish")
def npu_mish(self):
    """Mish: ``x * tanh(softplus(x))``, ``softplus(x) = log(1 + exp(x))``."""
    return F.mish(self)


@impl("npu_mish_backward")
def npu_mish_backward(grad, input):
    """Gradient of Mish: with ``t = tanh(softplus(x))``,
    ``grad * (t + x * sigmoid(x) * (1 - t^2))``."""
    return torch.ops.aten.mish_backward(grad, input)
