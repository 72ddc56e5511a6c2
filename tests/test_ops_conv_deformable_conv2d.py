"""npu_deformable_conv2d / npu_deformable_conv2dbk against references written here from the documented
formula (op-plugin docs, CANN DeformableOffsets, torch_npu's test golden): a float64 loop over every
output pixel and kernel tap with scalar bilinear sampling (offset channels [x | y | mask], each
[dg, kh, kw]), the grouped convolution of the columns as an einsum, and the loop adjoint of both for
the backward op. Zero offsets with mask 1 must reproduce torch.nn.functional.conv2d."""
import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_npu

from _op_helpers import DEVICES

F64 = torch.float64

# (N, C, H, W, Cout, kh, kw, stride_hw, padding tblr, dilation_hw, groups, deformable_groups)
CASES = [
    (2, 4, 6, 5, 6, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1, 1),
    (1, 4, 7, 8, 4, 3, 3, (2, 1), (1, 0, 2, 1), (2, 1), 2, 2),
    (2, 6, 5, 6, 3, 2, 3, (1, 2), (0, 1, 1, 0), (1, 2), 3, 3),
]


def out_size(h, w, kh, kw, s, p, d):
    return (h + p[0] + p[1] - ((kh - 1) * d[0] + 1)) // s[0] + 1, (w + p[2] + p[3] - ((kw - 1) * d[1] + 1)) // s[1] + 1


def op_args(kh, kw, s, p, d, groups, dg):
    return dict(kernel_size=[kh, kw], stride=[1, 1, s[0], s[1]], padding=list(p), dilation=[1, 1, d[0], d[1]],
                groups=groups, deformable_groups=dg)


def make_inputs(case, dtype=torch.float32, seed=0):
    n, c, h, w, cout, kh, kw, s, p, d, groups, dg = case
    gen = torch.Generator().manual_seed(seed)
    ho, wo = out_size(h, w, kh, kw, s, p, d)
    x = torch.randn(n, c, h, w, generator=gen)
    weight = torch.randn(cout, c // groups, kh, kw, generator=gen)
    bias = torch.randn(cout, generator=gen)
    k = dg * kh * kw
    offset = torch.empty(n, 3 * k, ho, wo)
    # offsets in [-2.5, 2.5) reach outside the image; the mask is used as given (no sigmoid), so
    # it also takes values outside [0, 1].
    offset[:, :2 * k] = torch.rand(n, 2 * k, ho, wo, generator=gen) * 5 - 2.5
    offset[:, 2 * k:] = torch.rand(n, k, ho, wo, generator=gen) * 3 - 1
    return [t.to(dtype) for t in (x, weight, offset, bias)]


def corners_of(y, x, h, w):
    """Documented bilinear rule: floor corners, 0 outside; no support when y<=-1, y>=H, x<=-1, x>=W.
    Yields (row, col, weight, d weight/dx, d weight/dy) for corners inside the image."""
    if y <= -1 or y >= h or x <= -1 or x >= w:
        return
    y0, x0 = math.floor(y), math.floor(x)
    ly, lx = y - y0, x - x0
    for cy, wy, sy in ((y0, 1 - ly, -1), (y0 + 1, ly, 1)):
        for cx, wx, sx in ((x0, 1 - lx, -1), (x0 + 1, lx, 1)):
            if 0 <= cy < h and 0 <= cx < w:
                yield cy, cx, wy * wx, wy * sx, wx * sy


def taps(x, offset, kh, kw, s, p, d, dg):
    """Every (n, g, i, j, ho, wo) tap: its offset channels, sampling point and mask, in float64."""
    n_, c, h, w = x.shape
    ho_n, wo_n = offset.shape[2:]
    k = dg * kh * kw
    for n in range(n_):
        for g in range(dg):
            for i in range(kh):
                for j in range(kw):
                    ch = g * kh * kw + i * kw + j
                    for ho in range(ho_n):
                        for wo in range(wo_n):
                            dx, dy, m = (float(offset[n, part * k + ch, ho, wo]) for part in range(3))
                            y = ho * s[0] - p[0] + i * d[0] + dy
                            xx = wo * s[1] - p[2] + j * d[1] + dx
                            yield n, g, i, j, ho, wo, ch, y, xx, m


def ref_columns(x, offset, kh, kw, s, p, d, dg):
    x = x.to(F64)
    n_, c, h, w = x.shape
    cg = c // dg
    ho_n, wo_n = offset.shape[2:]
    cols = torch.zeros(n_, c, ho_n * kh, wo_n * kw, dtype=F64)
    for n, g, i, j, ho, wo, _, y, xx, m in taps(x, offset, kh, kw, s, p, d, dg):
        val = torch.zeros(cg, dtype=F64)
        for cy, cx, wt, _, _ in corners_of(y, xx, h, w):
            val += wt * x[n, g * cg:(g + 1) * cg, cy, cx]
        cols[n, g * cg:(g + 1) * cg, ho * kh + i, wo * kw + j] = m * val
    return cols


def ref_conv(cols, weight, bias, kh, kw, groups):
    """out[n, o, ho, wo] = bias[o] + sum_{c in o's group, i, j} weight[o, c, i, j] * cols[n, c, ho*kh+i, wo*kw+j]."""
    n, c, hk, wk = cols.shape
    blocks = cols.view(n, groups, c // groups, hk // kh, kh, wk // kw, kw)
    wg = weight.to(F64).view(groups, -1, c // groups, kh, kw)
    out = torch.einsum("ngchiwj,gocij->ngohw", blocks, wg).reshape(n, -1, hk // kh, wk // kw)
    return out if bias is None else out + bias.to(F64).view(1, -1, 1, 1)


def ref_backward(x, grad_out, cols, weight, offset, kh, kw, s, p, d, groups, dg):
    """Loop adjoint: (grad_input, grad_weight, grad_offset, grad_bias) in float64."""
    x, grad_out, cols, weight = (t.to(F64) for t in (x, grad_out, cols, weight))
    n_, c, h, w = x.shape
    cout, cg_w = weight.shape[:2]
    ho_n, wo_n = grad_out.shape[2:]
    blocks = cols.view(n_, groups, cg_w, ho_n, kh, wo_n, kw)
    go = grad_out.view(n_, groups, cout // groups, ho_n, wo_n)
    grad_weight = torch.einsum("ngohw,ngchiwj->gocij", go, blocks).reshape(weight.shape)
    wg = weight.view(groups, cout // groups, cg_w, kh, kw)
    grad_cols = torch.einsum("ngohw,gocij->ngchiwj", go, wg).reshape(cols.shape)
    grad_bias = grad_out.sum((0, 2, 3))
    cg = c // dg
    k = dg * kh * kw
    grad_x = torch.zeros_like(x)
    grad_offset = torch.zeros(offset.shape, dtype=F64)
    for n, g, i, j, ho, wo, ch, y, xx, m in taps(x, offset, kh, kw, s, p, d, dg):
        gcol = grad_cols[n, g * cg:(g + 1) * cg, ho * kh + i, wo * kw + j]
        for cy, cx, wt, dwx, dwy in corners_of(y, xx, h, w):
            v = float((gcol * x[n, g * cg:(g + 1) * cg, cy, cx]).sum())
            grad_x[n, g * cg:(g + 1) * cg, cy, cx] += m * wt * gcol
            grad_offset[n, ch, ho, wo] += m * dwx * v
            grad_offset[n, k + ch, ho, wo] += m * dwy * v
            grad_offset[n, 2 * k + ch, ho, wo] += wt * v
    return grad_x, grad_weight, grad_offset, grad_bias


# ---------------------------------------------------------------- forward


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES)
def test_zero_offsets_unit_mask_equal_conv2d(device, case):
    n, c, h, w, cout, kh, kw, s, p, d, groups, dg = case
    x, weight, offset, bias = make_inputs(case)
    k = dg * kh * kw
    offset.zero_()
    offset[:, 2 * k:] = 1
    out, _ = torch_npu.npu_deformable_conv2d(x.to(device), weight.to(device), offset.to(device), bias.to(device),
                                             **op_args(kh, kw, s, p, d, groups, dg))
    padded = torch.nn.functional.pad(x, (p[2], p[3], p[0], p[1]))
    expected = torch.nn.functional.conv2d(padded, weight, bias, stride=s, dilation=d, groups=groups)
    assert out.device.type == device and out.dtype == torch.float32
    torch.testing.assert_close(out.cpu(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES)
def test_forward_matches_loop_reference(device, case):
    n, c, h, w, cout, kh, kw, s, p, d, groups, dg = case
    x, weight, offset, bias = make_inputs(case, seed=1)
    out, cols = torch_npu.npu_deformable_conv2d(x.to(device), weight.to(device), offset.to(device),
                                                bias.to(device), **op_args(kh, kw, s, p, d, groups, dg))
    ref_cols = ref_columns(x, offset, kh, kw, s, p, d, dg)
    ho, wo = out_size(h, w, kh, kw, s, p, d)
    assert tuple(cols.shape) == (n, c, ho * kh, wo * kw) and tuple(out.shape) == (n, cout, ho, wo)
    torch.testing.assert_close(cols.cpu().to(F64), ref_cols, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.cpu().to(F64), ref_conv(ref_cols, weight, bias, kh, kw, groups),
                               rtol=1e-4, atol=1e-4)


def test_offset_channel_order_is_x_then_y_then_mask():
    # One 1x1 tap on a ramp image: x offsets move along the width, y offsets along the height.
    x = (torch.arange(4.).view(1, 4) * 10 + torch.arange(5.).view(5, 1)).view(1, 1, 5, 4)  # value = 10*col + row
    weight = torch.ones(1, 1, 1, 1)
    offset = torch.zeros(1, 3, 5, 4)
    offset[:, 0] = 1.0   # dx
    offset[:, 1] = 0.5   # dy
    offset[:, 2] = 2.0   # mask
    out, cols = torch_npu.npu_deformable_conv2d(x, weight, offset, None, kernel_size=[1, 1],
                                                stride=[1, 1, 1, 1], padding=[0, 0, 0, 0])
    # inside: 2 * (10*(col+1) + row + 0.5); the last column reads past the right edge (zeros).
    assert torch.equal(cols, out)
    expected = 2 * (x[0, 0, :, 1:] + 0.5)
    torch.testing.assert_close(out[0, 0, :4, :3], expected[:4])
    # row 4 + 0.5 mixes row 4 with the zero row below it; column 3 + 1 = 4 is fully outside.
    torch.testing.assert_close(out[0, 0, 4, :3], 2 * 0.5 * x[0, 0, 4, 1:])
    assert torch.all(out[0, 0, :, 3] == 0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("device", DEVICES)
def test_low_precision_inputs_compute_and_return_float32(device, dtype):
    case = CASES[1]
    n, c, h, w, cout, kh, kw, s, p, d, groups, dg = case
    x, weight, offset, bias = make_inputs(case, dtype=dtype, seed=2)
    out, cols = torch_npu.npu_deformable_conv2d(x.to(device), weight.to(device), offset.to(device),
                                                bias.to(device), **op_args(kh, kw, s, p, d, groups, dg))
    # As the adapter casts every input to float32: float32 results of the rounded inputs.
    assert out.dtype == cols.dtype == torch.float32
    ref_cols = ref_columns(x, offset, kh, kw, s, p, d, dg)
    torch.testing.assert_close(cols.cpu().to(F64), ref_cols, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.cpu().to(F64), ref_conv(ref_cols, weight, bias, kh, kw, groups),
                               rtol=1e-4, atol=1e-4)


def test_fake_tensor_and_meta_shapes():
    case = CASES[2]
    n, c, h, w, cout, kh, kw, s, p, d, groups, dg = case
    ho, wo = out_size(h, w, kh, kw, s, p, d)
    args = op_args(kh, kw, s, p, d, groups, dg)
    with FakeTensorMode():
        x, weight, offset, bias = (torch.empty(t.shape, dtype=torch.float16) for t in make_inputs(case))
        out, cols = torch_npu.npu_deformable_conv2d(x, weight, offset, bias, **args)
        assert tuple(out.shape) == (n, cout, ho, wo) and tuple(cols.shape) == (n, c, ho * kh, wo * kw)
        assert out.dtype == cols.dtype == torch.float32
        grads = torch_npu.npu_deformable_conv2dbk(x, out, cols, weight, offset, **args)
        assert [tuple(t.shape) for t in grads] == [tuple(x.shape), tuple(weight.shape), tuple(offset.shape),
                                                   (cout,)]
    x, weight, offset, bias = (t.to("meta") for t in make_inputs(case))
    out, cols = torch.ops.npu.npu_deformable_conv2d(x, weight, offset, bias, **args)
    assert out.device.type == "meta" and tuple(out.shape) == (n, cout, ho, wo)


# ---------------------------------------------------------------- backward


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES[1:])
def test_backward_op_matches_loop_adjoint(device, case):
    n, c, h, w, cout, kh, kw, s, p, d, groups, dg = case
    args = op_args(kh, kw, s, p, d, groups, dg)
    x, weight, offset, bias = make_inputs(case, seed=3)
    out, cols = torch_npu.npu_deformable_conv2d(x.to(device), weight.to(device), offset.to(device), bias.to(device),
                                                **args)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(4))
    got = torch_npu.npu_deformable_conv2dbk(x.to(device), grad_out.to(device), cols, weight.to(device),
                                            offset.to(device), **args)
    expected = ref_backward(x, grad_out, cols.cpu(), weight, offset, kh, kw, s, p, d, groups, dg)
    for name, g, e in zip(("input", "weight", "offset", "bias"), got, expected):
        assert g.device.type == device and g.dtype == torch.float32, name
        torch.testing.assert_close(g.cpu().to(F64), e, rtol=1e-4, atol=1e-4, msg=lambda m: "%s: %s" % (name, m))


def test_backward_op_equals_autograd_of_forward_float64():
    case = CASES[1]
    n, c, h, w, cout, kh, kw, s, p, d, groups, dg = case
    args = op_args(kh, kw, s, p, d, groups, dg)
    x, weight, offset, bias = (t.to(F64).requires_grad_() for t in make_inputs(case, seed=5))
    out, cols = torch_npu.npu_deformable_conv2d(x, weight, offset, bias, **args)
    assert out.dtype == F64
    grad_out = torch.randn_like(out)
    auto = torch.autograd.grad(out, (x, weight, offset, bias), grad_out)
    got = torch_npu.npu_deformable_conv2dbk(x.detach(), grad_out, cols.detach(), weight.detach(), offset.detach(),
                                            **args)
    for g, e in zip(got, (auto[0], auto[1], auto[2], auto[3])):
        torch.testing.assert_close(g, e, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck_float64(device):
    # deformable_groups=2, asymmetric padding; offsets up to 2.5 px reach outside the 3x3 image
    case = (1, 2, 3, 3, 2, 2, 2, (1, 1), (1, 0, 0, 1), (1, 1), 1, 2)
    n, c, h, w, cout, kh, kw, s, p, d, groups, dg = case
    args = op_args(kh, kw, s, p, d, groups, dg)
    inputs = [t.to(F64).to(device).requires_grad_() for t in make_inputs(case, seed=6)]

    def fn(x, weight, offset, bias):
        return torch_npu.npu_deformable_conv2d(x, weight, offset, bias, **args)[0]

    # full Jacobian on CPU; the npu run (same kernels, zero-copy) checks random projections
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-5, fast_mode=device == "npu")


# ---------------------------------------------------------------- errors


def test_errors():
    case = CASES[0]
    n, c, h, w, cout, kh, kw, s, p, d, groups, dg = case
    x, weight, offset, bias = make_inputs(case)
    args = op_args(kh, kw, s, p, d, groups, dg)
    op = torch_npu.npu_deformable_conv2d
    with pytest.raises(RuntimeError, match="modulated=False"):
        op(x, weight, offset, bias, **args, modulated=False)
    with pytest.raises(RuntimeError, match=r"offset must be \[N, 3 \* deformable_groups \* kh \* kw, Ho, Wo\]"):
        op(x, weight, offset[:, :18], bias, **args)
    with pytest.raises(RuntimeError, match=r"offset must be"):
        op(x, weight, offset[:, :, :-1], bias, **args)
    with pytest.raises(RuntimeError, match="kernel_size"):
        op(x, weight, offset, bias, **dict(args, kernel_size=[3, 2]))
    with pytest.raises(RuntimeError, match=r"stride must be \[1, 1, stride_h, stride_w\]"):
        op(x, weight, offset, bias, **dict(args, stride=[2, 1, 1, 1]))
    with pytest.raises(RuntimeError, match="padding must be 4"):
        op(x, weight, offset, bias, **dict(args, padding=[1, 1]))
    with pytest.raises(RuntimeError, match=r"dilation must be \[1, 1"):
        op(x, weight, offset, bias, **dict(args, dilation=[1, 1, 0, 1]))
    with pytest.raises(RuntimeError, match="deformable_groups=3 must divide"):
        op(x, weight, offset, bias, **dict(args, deformable_groups=3))
    with pytest.raises(RuntimeError, match="groups=4 must divide"):
        op(x, weight, offset, bias, **dict(args, groups=4))
    with pytest.raises(RuntimeError, match="weight must be"):
        op(x, weight[:, :2], offset, bias, **args)
    with pytest.raises(RuntimeError, match="bias must be 1-D"):
        op(x, weight, offset, bias[:3], **args)
    with pytest.raises(RuntimeError, match="input must be 4-D"):
        op(x[0], weight, offset, bias, **args)
    with pytest.raises(RuntimeError, match="must be float16, bfloat16, float32"):
        op(x.long(), weight, offset, bias, **args)
    out, cols = op(x, weight, offset, bias, **args)
    with pytest.raises(RuntimeError, match="offset_out must be"):
        torch_npu.npu_deformable_conv2dbk(x, out, cols[:, :, :-1], weight, offset, **args)
    with pytest.raises(RuntimeError, match="grad_output must be"):
        torch_npu.npu_deformable_conv2dbk(x, out[:, :-1], cols, weight, offset, **args)
