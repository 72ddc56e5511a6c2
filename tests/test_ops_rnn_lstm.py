"""npu_lstm / npu_lstm_data / npu_lstm_cell (+ backwards) against float64 gate loops written here
and torch.nn.LSTM / nn.LSTMCell, with the weights packed as op-plugin packs them:
weight = cat([w_ih, w_hh], 1).t() ([I+H, 4H], gate columns i, f, j, o), bias = b_ih + b_hh."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_npu

from _op_helpers import DEVICES

T, B, I, H = 5, 3, 4, 6
NO_MASK = torch.empty(0)
TOL = {torch.float32: 1e-5, torch.float16: 3e-3}


def gate_loop(x, w_ih, w_hh, bias, h, c, reverse=False):
    """float64 reference: w_ih [4H, I], w_hh [4H, H] in nn.LSTM layout (rows i, f, g, o).
    Returns (h, c, i, g, f, o, tanh(c)) per step, each [T, B, H], stored at their time index."""
    x, w_ih, w_hh, bias, h, c = (t.double() for t in (x, w_ih, w_hh, bias, h, c))
    hid = w_hh.shape[1]
    rows = [None] * x.shape[0]
    order = range(x.shape[0] - 1, -1, -1) if reverse else range(x.shape[0])
    for t in order:
        z = x[t] @ w_ih.t() + h @ w_hh.t() + bias
        i = torch.sigmoid(z[:, :hid])
        f = torch.sigmoid(z[:, hid:2 * hid])
        g = torch.tanh(z[:, 2 * hid:3 * hid])
        o = torch.sigmoid(z[:, 3 * hid:])
        c = f * c + i * g
        h = o * torch.tanh(c)
        rows[t] = (h, c, i, g, f, o, torch.tanh(c))
    return [torch.stack([r[k] for r in rows]) for k in range(7)]


def make(dtype=torch.float32, seed=0, steps=T, batch=B, inp=I, hid=H):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: (torch.rand(*s, generator=gen, dtype=torch.float64) * 2 - 1)  # noqa: E731
    return dict(x=r(steps, batch, inp).to(dtype), w_ih=(0.5 * r(4 * hid, inp)).to(dtype),
                w_hh=(0.5 * r(4 * hid, hid)).to(dtype), b_ih=(0.3 * r(4 * hid)).to(dtype),
                b_hh=(0.3 * r(4 * hid)).to(dtype), h=r(1, batch, hid).to(dtype), c=r(1, batch, hid).to(dtype))


def packed(p):
    return torch.cat([p["w_ih"], p["w_hh"]], 1).t().contiguous(), p["b_ih"] + p["b_hh"]


def run_lstm(p, device, direction=False, flag_seq=False, op=None):
    weight, bias = packed(p)
    args = [t.to(device) for t in (p["x"], weight, bias, NO_MASK, p["h"], p["c"])]
    return (op or torch_npu.npu_lstm)(*args, True, 1, 0.0, True, False, False, flag_seq, direction)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("direction", [False, True])
def test_npu_lstm_outputs_match_gate_loop(device, dtype, direction):
    p = make(dtype)
    outs = run_lstm(p, device, direction=direction)
    assert len(outs) == 8
    hs, cs, i, g, f, o, tanhc = gate_loop(p["x"], p["w_ih"], p["w_hh"], p["b_ih"].double() + p["b_hh"].double(),
                                          p["h"][0], p["c"][0], reverse=direction)
    for got, want in zip(outs, (hs, hs, cs, i, g, f, o, tanhc)):
        assert got.device.type == device and got.dtype == dtype and got.shape == (T, B, H)
        torch.testing.assert_close(got.cpu().double(), want, atol=TOL[dtype], rtol=0)


@pytest.mark.parametrize("direction", [False, True])
def test_npu_lstm_agrees_with_nn_lstm(direction):
    torch.manual_seed(1)
    lstm = torch.nn.LSTM(I, H).double()
    p = make(torch.float64)
    p.update(w_ih=lstm.weight_ih_l0.detach(), w_hh=lstm.weight_hh_l0.detach(), b_ih=lstm.bias_ih_l0.detach(),
             b_hh=lstm.bias_hh_l0.detach())
    y, hs, cs = run_lstm(p, "cpu", direction=direction)[:3]
    x = p["x"].flip(0) if direction else p["x"]
    ref_y, (ref_h, ref_c) = lstm(x, (p["h"], p["c"]))
    if direction:  # the reverse pass stores each step at its own time index: final state at t = 0
        ref_y = ref_y.flip(0)
    last = 0 if direction else -1
    torch.testing.assert_close(y, ref_y.detach())
    torch.testing.assert_close(hs[last], ref_h[0].detach())
    torch.testing.assert_close(cs[last], ref_c[0].detach())


@pytest.mark.parametrize("device", DEVICES)
def test_npu_lstm_data_runs_the_same_kernel(device):
    p = make()
    weight, bias = packed(p)
    batch_sizes = torch.full((T,), B, dtype=torch.int64)
    outs = torch_npu.npu_lstm_data(*[t.to(device) for t in (p["x"], batch_sizes, weight, bias, NO_MASK, p["h"],
                                                            p["c"])], True, 1, 0.0, True, False, False, False, False)
    want = gate_loop(p["x"], p["w_ih"], p["w_hh"], p["b_ih"] + p["b_hh"], p["h"][0], p["c"][0])
    torch.testing.assert_close(outs[0].cpu().double(), want[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(outs[2].cpu().double(), want[1], atol=1e-5, rtol=0)


def reference_grads(p, gy, gh_last, gc_last):
    """Gradients of sum(y*gy) + sum(h_T*gh_last) + sum(c_T*gc_last) through the float64 gate loop."""
    leaves = [t.double().clone().requires_grad_() for t in (p["x"], p["w_ih"], p["w_hh"], p["b_ih"], p["b_hh"],
                                                             p["h"], p["c"])]
    x, w_ih, w_hh, b_ih, b_hh, h, c = leaves
    hs, cs = gate_loop(x, w_ih, w_hh, b_ih + b_hh, h[0], c[0])[:2]
    loss = (hs * gy.double()).sum() + (hs[-1] * gh_last.double()).sum() + (cs[-1] * gc_last.double()).sum()
    return torch.autograd.grad(loss, leaves)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_npu_lstm_autograd_routes_like_the_real_backward(device, dtype):
    p = make(dtype, seed=2)
    weight, bias = packed(p)
    leaves = [t.to(device).requires_grad_() for t in (p["x"], weight, bias, p["h"], p["c"])]
    x, w, b, h, c = leaves
    outs = torch_npu.npu_lstm(x, w, b, NO_MASK.to(device), h, c, True, 1, 0.0, True, False, False, False, False)
    gen = torch.Generator().manual_seed(3)
    gy, gh, gc = (torch.randn(T, B, H, generator=gen).to(dtype) for _ in range(3))
    # Only step T-1 of the h and c gradients reaches the inputs (npu_lstm_backward reads gradh[T-1]);
    # the gate outputs get gradients that are ignored.
    loss = ((outs[0] * gy.to(device)).sum() + (outs[1] * gh.to(device)).sum() + (outs[2] * gc.to(device)).sum()
            + outs[3].sum())
    got = torch.autograd.grad(loss, leaves)
    dx, dw_ih, dw_hh, db_ih, db_hh, dh, dc = reference_grads(p, gy, gh[-1], gc[-1])
    want = (dx, torch.cat([dw_ih, dw_hh], 1).t(), db_ih, dh, dc)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    for g, r in zip(got, want):
        assert g.device.type == device and g.dtype == dtype
        torch.testing.assert_close(g.cpu().double(), r, atol=tol, rtol=tol)


@pytest.mark.parametrize("device", DEVICES)
def test_npu_lstm_backward_and_data_backward_ops(device):
    p = make(seed=4)
    weight, bias = packed(p)
    outs = run_lstm(p, device)
    gen = torch.Generator().manual_seed(5)
    gy, gh, gc = (torch.randn(T, B, H, generator=gen) for _ in range(3))
    saved = [t.to(device) for t in (p["x"], weight, bias, p["h"], p["c"])]
    dx, dw_ih, dw_hh, db_ih, _, dh, dc = reference_grads(p, gy, gh[-1], gc[-1])
    want = (dx, torch.cat([dw_ih, dw_hh], 1).t(), db_ih, dh, dc)
    got = torch_npu.npu_lstm_backward(gy.to(device), gh.to(device), gc.to(device), *saved, *outs)
    got_data = torch.ops.npu.npu_lstm_data_backward(
        gy.to(device), gh.to(device), gc.to(device), saved[0], torch.full((T,), B), *saved[1:], *outs, False)
    for res in (got, got_data):
        assert [tuple(g.shape) for g in res] == [(T, B, I), (I + H, 4 * H), (4 * H,), (1, B, H), (1, B, H)]
        for g, r in zip(res, want):
            assert g.device.type == device
            torch.testing.assert_close(g.cpu().double(), r, atol=1e-4, rtol=1e-4)
    # Missing gradients count as zeros.
    only_y = torch_npu.npu_lstm_backward(gy.to(device), None, None, *saved, *outs)
    want_y = reference_grads(p, gy, torch.zeros(B, H), torch.zeros(B, H))
    torch.testing.assert_close(only_y[0].cpu().double(), want_y[0], atol=1e-4, rtol=1e-4)


def test_npu_lstm_gradcheck_float64():
    p = make(torch.float64, seed=6, steps=3, batch=2, inp=3, hid=2)
    weight, bias = packed(p)
    leaves = [t.clone().requires_grad_() for t in (p["x"], weight, bias, p["h"], p["c"])]

    def fn(x, w, b, h, c):
        y, hs, cs = torch_npu.npu_lstm(x, w, b, NO_MASK, h, c, True, 1, 0.0, True, False, False, False, False)[:3]
        return y, hs[-1], cs[-1]

    assert torch.autograd.gradcheck(fn, leaves)


def cell_inputs(p):
    return p["x"][0], p["w_ih"].t().contiguous(), p["w_hh"].t().contiguous(), p["h"][0], p["c"][0]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("with_bias", [True, False])
def test_npu_lstm_cell_matches_gate_loop_and_nn_lstm_cell(device, dtype, with_bias):
    p = make(dtype, seed=7)
    biases = (p["b_ih"].to(device), p["b_hh"].to(device)) if with_bias else ()
    outs = torch_npu.npu_lstm_cell(*[t.to(device) for t in cell_inputs(p)], *biases)
    bias = p["b_ih"].double() + p["b_hh"].double() if with_bias else torch.zeros(4 * H, dtype=torch.float64)
    hs, cs, i, g, f, o, tanhc = gate_loop(p["x"][:1], p["w_ih"], p["w_hh"], bias, p["h"][0], p["c"][0])
    shapes = [(1, B, H), (B, H), (B, H)] + [(1, B, H)] * 5
    for got, want, shape in zip(outs, (hs, hs[0], cs[0], i, g, f, o, tanhc), shapes):
        assert got.device.type == device and got.dtype == dtype and tuple(got.shape) == shape
        torch.testing.assert_close(got.cpu().double(), want, atol=TOL[dtype], rtol=0)
    if dtype == torch.float32:
        cell = torch.nn.LSTMCell(I, H, bias=with_bias)
        with torch.no_grad():
            cell.weight_ih.copy_(p["w_ih"])
            cell.weight_hh.copy_(p["w_hh"])
            if with_bias:
                cell.bias_ih.copy_(p["b_ih"])
                cell.bias_hh.copy_(p["b_hh"])
        ref_h, ref_c = cell(p["x"][0], (p["h"][0], p["c"][0]))
        torch.testing.assert_close(outs[1].cpu(), ref_h.detach(), atol=1e-5, rtol=0)
        torch.testing.assert_close(outs[2].cpu(), ref_c.detach(), atol=1e-5, rtol=0)


def cell_reference_grads(p, gy, gh, gc):
    leaves = [t.double().clone().requires_grad_() for t in (p["x"], p["w_ih"], p["w_hh"], p["b_ih"], p["b_hh"],
                                                             p["h"], p["c"])]
    x, w_ih, w_hh, b_ih, b_hh, h, c = leaves
    hs, cs = gate_loop(x[:1], w_ih, w_hh, b_ih + b_hh, h[0], c[0])[:2]
    loss = (hs * gy.double()).sum() + (hs[0] * gh.double()).sum() + (cs[0] * gc.double()).sum()
    dx, dw_ih, dw_hh, db_ih, db_hh, dh, dc = torch.autograd.grad(loss, leaves)
    return dx[0], dw_ih.t(), dw_hh.t(), db_ih, db_hh, dh[0], dc[0]


@pytest.mark.parametrize("device", DEVICES)
def test_npu_lstm_cell_autograd_and_backward_op(device):
    p = make(seed=8)
    gen = torch.Generator().manual_seed(9)
    gy, gh, gc = torch.randn(1, B, H, generator=gen), torch.randn(B, H, generator=gen), torch.randn(B, H, generator=gen)
    want = cell_reference_grads(p, gy, gh, gc)
    leaves = [t.to(device).requires_grad_() for t in cell_inputs(p) + (p["b_ih"], p["b_hh"])]
    x, w_ih, w_hh, h, c, b_ih, b_hh = leaves
    outs = torch_npu.npu_lstm_cell(x, w_ih, w_hh, h, c, b_ih, b_hh)
    loss = (outs[0] * gy.to(device)).sum() + (outs[1] * gh.to(device)).sum() + (outs[2] * gc.to(device)).sum()
    got = torch.autograd.grad(loss, leaves)
    got = (got[0], got[1], got[2], got[5], got[6], got[3], got[4])  # reorder to (x, w_ih, w_hh, b_ih, b_hh, h, c)
    for g, r in zip(got, want):
        torch.testing.assert_close(g.cpu().double(), r, atol=1e-4, rtol=1e-4)
    with torch.no_grad():
        saved = torch_npu.npu_lstm_cell(x, w_ih, w_hh, h, c, b_ih, b_hh)
    back = torch_npu.npu_lstm_cell_backward(gy.to(device), gh.to(device), gc.to(device), x, w_ih, w_hh, h, c, *saved)
    assert len(back) == 7
    for g, r in zip(back, want):
        assert g.device.type == device
        torch.testing.assert_close(g.cpu().double(), r, atol=1e-4, rtol=1e-4)


def test_npu_lstm_cell_gradcheck_float64():
    p = make(torch.float64, seed=10, batch=2, inp=3, hid=2)
    leaves = [t.clone().requires_grad_() for t in cell_inputs(p) + (p["b_ih"], p["b_hh"])]
    assert torch.autograd.gradcheck(lambda *a: torch_npu.npu_lstm_cell(*a)[:3], leaves)


def test_fake_tensor_shapes():
    p = make()
    weight, bias = packed(p)
    cell_real = cell_inputs(p)
    with FakeTensorMode() as mode:
        fx, fw, fb, fh, fc, fm = (mode.from_tensor(t) for t in (p["x"], weight, bias, p["h"], p["c"], NO_MASK))
        outs = torch.ops.npu.npu_lstm(fx, fw, fb, fm, fh, fc, True, 1, 0.0, True, False, False, False, False)
        assert [tuple(o.shape) for o in outs] == [(T, B, H)] * 8
        back = torch.ops.npu.npu_lstm_backward(outs[0], outs[1], outs[2], fx, fw, fb, fh, fc, *outs)
        assert [tuple(g.shape) for g in back] == [(T, B, I), (I + H, 4 * H), (4 * H,), (1, B, H), (1, B, H)]
        cx, cwi, cwh, ch, cc = (mode.from_tensor(t) for t in cell_real)
        cell = torch.ops.npu.npu_lstm_cell(cx, cwi, cwh, ch, cc)
        assert [tuple(o.shape) for o in cell] == [(1, B, H), (B, H), (B, H)] + [(1, B, H)] * 5


def test_documented_unsupported_modes_raise():
    p = make()
    with pytest.raises(NotImplementedError, match="flag_seq"):
        run_lstm(p, "cpu", flag_seq=True)
    with pytest.raises(NotImplementedError, match="flag_seq"):
        weight, bias = packed(p)
        torch_npu.npu_lstm_data(p["x"], torch.full((T,), B), weight, bias, NO_MASK, p["h"], p["c"], True, 1, 0.0,
                                True, False, False, True, False)
    x = p["x"].clone().requires_grad_()
    p["x"] = x
    y = run_lstm(p, "cpu", direction=True)[0]
    with pytest.raises(NotImplementedError, match="direction=True"):
        y.sum().backward()
    p = make()
    weight, bias = packed(p)
    outs = run_lstm(p, "cpu")
    rest = (weight, bias, p["h"], p["c"], *outs)
    with pytest.raises(NotImplementedError, match="flag_direction"):
        torch_npu.npu_lstm_data_backward(outs[0], None, None, p["x"], torch.full((T,), B), *rest, True)
    with pytest.raises(NotImplementedError, match="padded steps"):
        torch_npu.npu_lstm_data_backward(outs[0], None, None, p["x"], torch.tensor([3, 3, 2, 2, 1]), *rest, False)


def test_shape_and_dtype_errors():
    p = make()
    weight, bias = packed(p)
    call = lambda x, w, b, h, c: torch_npu.npu_lstm(x, w, b, NO_MASK, h, c, True, 1, 0.0, True, False, False,  # noqa
                                                    False, False)
    with pytest.raises(RuntimeError, match="input must be 3-D"):
        call(p["x"][0], weight, bias, p["h"], p["c"])
    with pytest.raises(RuntimeError, match=r"weight must be \[input_size \+ hidden_size"):
        call(p["x"], weight[1:], bias, p["h"], p["c"])
    with pytest.raises(RuntimeError, match="bias must be 1-D"):
        call(p["x"], weight, bias[1:], p["h"], p["c"])
    with pytest.raises(RuntimeError, match=r"h must be \[1, B, hidden_size\]"):
        call(p["x"], weight, bias, p["h"][0], p["c"])
    with pytest.raises(RuntimeError, match="weight dtype torch.float16 must match"):
        call(p["x"], weight.half(), bias, p["h"], p["c"])
    with pytest.raises(RuntimeError, match="input must be float16 or float32"):
        call(*(t.bfloat16() for t in (p["x"], weight, bias, p["h"], p["c"])))
    x, w_ih, w_hh, h, c = cell_inputs(p)
    with pytest.raises(RuntimeError, match=r"w_ih must be \[input_size, 4\*hidden_size\]"):
        torch_npu.npu_lstm_cell(x, w_ih[1:], w_hh, h, c)
    with pytest.raises(RuntimeError, match="b_hh must be given together with b_ih"):
        torch_npu.npu_lstm_cell(x, w_ih, w_hh, h, c, p["b_ih"])


@pytest.mark.parametrize("train", [True, False])
def test_gate_outputs_format_follows_train(train):
    # The real adapter allocates i, j, f, o, tanhc in FRACTAL_NZ when training (always for the cell).
    p = make(seed=11)
    weight, bias = packed(p)
    args = [t.to("npu") for t in (p["x"], weight, bias, NO_MASK, p["h"], p["c"])]
    outs = torch_npu.npu_lstm(*args, True, 1, 0.0, train, False, False, False, False)
    nz, nd = 29, 2
    assert [torch_npu.get_npu_format(t) for t in outs] == [nd] * 3 + [nz if train else nd] * 5
    cell = torch_npu.npu_lstm_cell(*[t.to("npu") for t in cell_inputs(p)])
    assert [torch_npu.get_npu_format(t) for t in cell] == [nd] * 3 + [nz] * 5
