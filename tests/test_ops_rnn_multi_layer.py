"""_lstm_npu / _gru_npu (+ backwards) and npu_gru (+ backward) against float64 gate loops written
here and torch.nn.LSTM / nn.GRU (their autograd for the gradients).

Layouts under test (op-plugin's adapters): params = nn.LSTM/nn.GRU _flat_weights, hx [L*D, B, H],
per-step outputs stacked [L*D, T, B, H] (cell l*D + d), the reverse direction's steps stored at
their own time index; npu_gru takes the transposed nn.GRU weights ([I, 3H], [H, 3H], gates r, z, n)
and returns y, output_h, update (z), reset (r), new (n), hidden_new (W_hn h_{t-1} + b_hn)."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_npu

from _op_helpers import DEVICES

npu = torch.ops.npu
T, B, I, H = 4, 3, 5, 4
TOL = {torch.float32: 2e-5, torch.float16: 6e-3}


def rnd(gen, *shape, scale=1.0):
    return (torch.rand(*shape, generator=gen, dtype=torch.float64) * 2 - 1) * scale


def make_params(kind, num_layers, directions, has_biases, seed=0, inp=I, hid=H):
    """nn.LSTM / nn.GRU style flat params (float64): per layer, per direction w_ih, w_hh[, b_ih, b_hh]."""
    gen = torch.Generator().manual_seed(seed)
    gates = 4 if kind == "lstm" else 3
    params = []
    for layer in range(num_layers):
        layer_in = inp if layer == 0 else directions * hid
        for _ in range(directions):
            params += [rnd(gen, gates * hid, layer_in, scale=0.5), rnd(gen, gates * hid, hid, scale=0.5)]
            if has_biases:
                params += [rnd(gen, gates * hid, scale=0.3), rnd(gen, gates * hid, scale=0.3)]
    return params, rnd(gen, T, B, inp), rnd(gen, num_layers * directions, B, hid), \
        rnd(gen, num_layers * directions, B, hid)


def lstm_cell_loop(x, w_ih, w_hh, b, h, c, reverse):
    """float64: returns [h, c, i, g, f, o, tanh(c)], each [T, B, H] at its time index."""
    hid = w_hh.shape[1]
    rows = [None] * x.shape[0]
    for t in (range(x.shape[0] - 1, -1, -1) if reverse else range(x.shape[0])):
        zz = x[t] @ w_ih.t() + h @ w_hh.t() + b
        i, f = torch.sigmoid(zz[:, :hid]), torch.sigmoid(zz[:, hid:2 * hid])
        g, o = torch.tanh(zz[:, 2 * hid:3 * hid]), torch.sigmoid(zz[:, 3 * hid:])
        c = f * c + i * g
        h = o * torch.tanh(c)
        rows[t] = (h, c, i, g, f, o, torch.tanh(c))
    return [torch.stack([r[k] for r in rows]) for k in range(7)]


def gru_cell_loop(x, w_ih, w_hh, b_ih, b_hh, h, reverse):
    """float64 nn.GRU step: returns [h, r, z, n, W_hn h_prev + b_hn], each [T, B, H]."""
    hid = w_hh.shape[1]
    rows = [None] * x.shape[0]
    for t in (range(x.shape[0] - 1, -1, -1) if reverse else range(x.shape[0])):
        gi, gh = x[t] @ w_ih.t() + b_ih, h @ w_hh.t() + b_hh
        r = torch.sigmoid(gi[:, :hid] + gh[:, :hid])
        z = torch.sigmoid(gi[:, hid:2 * hid] + gh[:, hid:2 * hid])
        hn = gh[:, 2 * hid:]
        n = torch.tanh(gi[:, 2 * hid:] + r * hn)
        h = (1 - z) * n + z * h
        rows[t] = (h, r, z, n, hn)
    return [torch.stack([r[k] for r in rows]) for k in range(5)]


def stack_loop(kind, x, h0, c0, params, num_layers, directions, has_biases):
    """float64 multi-layer reference: (y, per-cell loop outputs)."""
    per = 4 if has_biases else 2
    cells, layer_in = [], x
    for layer in range(num_layers):
        for d in range(directions):
            idx = layer * directions + d
            p = params[idx * per:(idx + 1) * per]
            zeros = torch.zeros(p[0].shape[0], dtype=torch.float64)
            b_ih, b_hh = (p[2], p[3]) if has_biases else (zeros, zeros)
            if kind == "lstm":
                cells.append(lstm_cell_loop(layer_in, p[0], p[1], b_ih + b_hh, h0[idx], c0[idx], d == 1))
            else:
                cells.append(gru_cell_loop(layer_in, p[0], p[1], b_ih, b_hh, h0[idx], d == 1))
        layer_in = torch.cat([cells[layer * directions + d][0] for d in range(directions)], dim=-1)
    return layer_in, cells


def nn_module(kind, params, num_layers, bidirectional, has_biases):
    cls = torch.nn.LSTM if kind == "lstm" else torch.nn.GRU
    mod = cls(I, H, num_layers, bias=has_biases, bidirectional=bidirectional).double()
    with torch.no_grad():
        for w, p in zip(mod._flat_weights, params):
            w.copy_(p)
    return mod


def close(actual, expected, tol):
    torch.testing.assert_close(actual.detach().cpu().double(), expected.detach().double(), rtol=tol, atol=tol)


CONFIGS = [(1, False, True), (2, True, True), (2, False, False)]  # (num_layers, bidirectional, has_biases)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("num_layers,bidirectional,has_biases", CONFIGS)
def test_lstm_npu_matches_loop_and_nn_lstm(device, dtype, num_layers, bidirectional, has_biases):
    directions = 2 if bidirectional else 1
    params, x, h0, c0 = make_params("lstm", num_layers, directions, has_biases)
    params, x, h0, c0 = [p.to(dtype) for p in params], x.to(dtype), h0.to(dtype), c0.to(dtype)
    outs = npu._lstm_npu(x.to(device), [h0.to(device), c0.to(device)], [p.to(device) for p in params], has_biases,
                         num_layers, 0.0, True, bidirectional)
    assert len(outs) == 10 and all(t.dtype == dtype and t.device.type == device for t in outs)
    d64 = lambda t: t.double()  # noqa: E731  the reference sees the same (rounded) inputs
    y, cells = stack_loop("lstm", d64(x), d64(h0), d64(c0), [d64(p) for p in params], num_layers, directions,
                          has_biases)
    tol = TOL[dtype]
    close(outs[0], y, tol)
    ref_y, (ref_hy, ref_cy) = nn_module("lstm", [d64(p) for p in params], num_layers, bidirectional, has_biases)(
        d64(x), (d64(h0), d64(c0)))
    close(outs[0], ref_y, tol)
    close(outs[1], ref_hy, tol)
    close(outs[2], ref_cy, tol)
    # per-step outputs: i, j(=g), f, o, h, c, tanhc stacked [L*D, T, B, H]
    for out_index, loop_index in zip(range(3, 10), (2, 3, 4, 5, 0, 1, 6)):
        assert tuple(outs[out_index].shape) == (num_layers * directions, T, B, H)
        close(outs[out_index], torch.stack([cell[loop_index] for cell in cells]), tol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("num_layers,bidirectional,has_biases", CONFIGS)
def test_gru_npu_matches_loop_and_nn_gru(device, dtype, num_layers, bidirectional, has_biases):
    directions = 2 if bidirectional else 1
    params, x, h0, _ = make_params("gru", num_layers, directions, has_biases, seed=1)
    params, x, h0 = [p.to(dtype) for p in params], x.to(dtype), h0.to(dtype)
    outs = npu._gru_npu(x.to(device), h0.to(device), [p.to(device) for p in params], has_biases, num_layers, 0.0,
                        True, bidirectional)
    assert len(outs) == 7 and all(t.dtype == dtype and t.device.type == device for t in outs)
    d64 = lambda t: t.double()  # noqa: E731
    y, cells = stack_loop("gru", d64(x), d64(h0), None, [d64(p) for p in params], num_layers, directions, has_biases)
    ref_y, ref_hy = nn_module("gru", [d64(p) for p in params], num_layers, bidirectional, has_biases)(d64(x), d64(h0))
    tol = TOL[dtype]
    close(outs[0], y, tol)
    close(outs[0], ref_y, tol)
    close(outs[1], ref_hy, tol)
    # r, z, n, h_n, h stacked [L*D, T, B, H]
    for out_index, loop_index in zip(range(2, 7), (1, 2, 3, 4, 0)):
        assert tuple(outs[out_index].shape) == (num_layers * directions, T, B, H)
        close(outs[out_index], torch.stack([cell[loop_index] for cell in cells]), tol)


def test_inference_mode_returns_no_gate_lists():
    params, x, h0, c0 = make_params("lstm", 2, 1, True, seed=2)
    lstm = npu._lstm_npu(x, [h0, c0], params, True, 2, 0.5, False, False)  # dropout is inert in inference
    assert [t is None for t in lstm] == [False] * 3 + [True] * 4 + [False, False, True]
    trained = npu._lstm_npu(x, [h0, c0], params, True, 2, 0.0, True, False)
    for k in (0, 1, 2, 7, 8):
        torch.testing.assert_close(lstm[k], trained[k])
    params, x, h0, _ = make_params("gru", 1, 1, True, seed=2)
    gru = npu._gru_npu(x, h0, params, True, 1, 0.0, False, False)
    assert [t is None for t in gru] == [False] * 2 + [True] * 5


def _weighted_loss(outs, weights):
    return sum((o * w).sum() for o, w in zip(outs, weights))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_autograd_and_backward_op_match_nn_autograd(device, kind):
    num_layers, bidirectional, has_biases = 2, True, True
    params, x, h0, c0 = make_params(kind, num_layers, 2, has_biases, seed=3)
    gen = torch.Generator().manual_seed(4)
    leaves = [t.clone().requires_grad_() for t in [x, h0] + ([c0] if kind == "lstm" else []) + params]
    mod = nn_module(kind, params, num_layers, bidirectional, has_biases)
    if kind == "lstm":
        ref_y, (ref_h, ref_c) = mod(leaves[0], (leaves[1], leaves[2]))
        ref_outs = (ref_y, ref_h, ref_c)
        ref_leaves = leaves[:3] + list(mod._flat_weights)
    else:
        ref_y, ref_h = mod(leaves[0], leaves[1])
        ref_outs = (ref_y, ref_h)
        ref_leaves = leaves[:2] + list(mod._flat_weights)
    weights = [rnd(gen, *t.shape) for t in ref_outs]
    expected = torch.autograd.grad(_weighted_loss(ref_outs, weights), ref_leaves)

    dev = [t.detach().to(device).requires_grad_() for t in leaves]
    if kind == "lstm":
        outs = npu._lstm_npu(dev[0], [dev[1], dev[2]], dev[3:], has_biases, num_layers, 0.0, True, bidirectional)
        differentiable = outs[:3]
    else:
        outs = npu._gru_npu(dev[0], dev[1], dev[2:], has_biases, num_layers, 0.0, True, bidirectional)
        differentiable = outs[:2]
    got = torch.autograd.grad(_weighted_loss(differentiable, [w.to(device) for w in weights]), dev)
    for g, e in zip(got, expected):
        assert g.device.type == device
        close(g, e, 1e-10)

    gw = [w.to(device) for w in weights]
    d = [t.detach() for t in dev]
    if kind == "lstm":
        dx, (dh, dc), dparams = npu._lstm_npu_backward(gw[0], gw[1], gw[2], d[0], [d[1], d[2]], d[3:], *outs[3:],
                                                       has_biases, num_layers, 0.0, True, bidirectional)
        op_grads = [dx, dh, dc] + list(dparams)
    else:
        dx, dh, dparams = npu._gru_npu_backward(gw[0], gw[1], d[0], d[1], d[2:], *outs[2:], has_biases, num_layers,
                                                0.0, True, bidirectional)
        op_grads = [dx, dh] + list(dparams)
    assert len(op_grads) == len(expected)
    for g, e in zip(op_grads, expected):
        close(g, e, 1e-10)


def test_backward_ops_treat_missing_grads_as_zeros():
    params, x, h0, c0 = make_params("lstm", 1, 1, True, seed=5)
    outs = npu._lstm_npu(x, [h0, c0], params, True, 1, 0.0, True, False)
    only_y = npu._lstm_npu_backward(torch.ones(T, B, H, dtype=torch.float64), None, None, x, [h0, c0], params,
                                    *outs[3:], True, 1, 0.0, True, False)
    zeros = torch.zeros(1, B, H, dtype=torch.float64)
    with_zeros = npu._lstm_npu_backward(torch.ones(T, B, H, dtype=torch.float64), zeros, zeros, x, [h0, c0], params,
                                        *outs[3:], True, 1, 0.0, True, False)
    torch.testing.assert_close(only_y[0], with_zeros[0])
    torch.testing.assert_close(only_y[2][0], with_zeros[2][0])
    assert only_y[0].abs().sum() > 0


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_gradcheck_float64(kind):
    inp, hid = 3, 2
    params, x, h0, c0 = make_params(kind, 2, 2, True, seed=6, inp=inp, hid=hid)
    x, h0, c0 = x[:3, :2], h0[:, :2], c0[:, :2]
    leaves = [t.clone().requires_grad_() for t in [x, h0, c0] + params]

    def fn(x, h0, c0, *ps):
        if kind == "lstm":
            return npu._lstm_npu(x, [h0, c0], list(ps), True, 2, 0.0, True, True)[:3]
        return npu._gru_npu(x, h0, list(ps), True, 2, 0.0, True, True)[:2]

    assert torch.autograd.gradcheck(fn, leaves)


# ----------------------------------------------------------------- npu_gru (DynamicGRUV2)

def gru_inputs(dtype=torch.float32, bias_dtype=None, seed=7, hx3d=True):
    gen = torch.Generator().manual_seed(seed)
    w_ih, w_hh = rnd(gen, 3 * H, I, scale=0.5), rnd(gen, 3 * H, H, scale=0.5)
    b_ih, b_hh = rnd(gen, 3 * H, scale=0.3), rnd(gen, 3 * H, scale=0.3)
    x, hx = rnd(gen, T, B, I), rnd(gen, 1, B, H) if hx3d else rnd(gen, B, H)
    bias_dtype = bias_dtype or dtype
    return dict(x=x.to(dtype), hx=hx.to(dtype), w_ih=w_ih.to(dtype), w_hh=w_hh.to(dtype), b_ih=b_ih.to(bias_dtype),
                b_hh=b_hh.to(bias_dtype))


def run_npu_gru(p, device):
    args = [t.to(device) for t in (p["x"], p["hx"], p["w_ih"].t(), p["w_hh"].t(), p["b_ih"], p["b_hh"])]
    seq_length = torch.tensor([T], dtype=torch.int32, device=device)
    return torch_npu.npu_gru(*args, seq_length, True, 1, 0.0, True, False, False)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,bias_dtype", [(torch.float32, None), (torch.float16, None),
                                              (torch.float16, torch.float32)])
@pytest.mark.parametrize("hx3d", [True, False])
def test_npu_gru_outputs_match_loop_and_nn_gru(device, dtype, bias_dtype, hx3d):
    p = gru_inputs(dtype, bias_dtype, hx3d=hx3d)
    outs = run_npu_gru(p, device)
    out_dtype = bias_dtype or dtype  # every output is allocated with bias_input's options
    assert len(outs) == 6 and all(tuple(t.shape) == (T, B, H) and t.dtype == out_dtype for t in outs)
    d = {k: v.double() for k, v in p.items()}
    h, r, z, n, hn = gru_cell_loop(d["x"], d["w_ih"], d["w_hh"], d["b_ih"], d["b_hh"], d["hx"].reshape(B, H), False)
    tol = TOL[dtype]
    for out, ref in zip(outs, (h, h, z, r, n, hn)):  # y, output_h, update, reset, new, hidden_new
        close(out, ref, tol)
    gru = nn_module("gru", [d["w_ih"], d["w_hh"], d["b_ih"], d["b_hh"]], 1, False, True)
    ref_y, ref_h = gru(d["x"], d["hx"].reshape(1, B, H))
    close(outs[0], ref_y, tol)
    close(outs[1][-1], ref_h[0], tol)


@pytest.mark.parametrize("device", DEVICES)
def test_npu_gru_autograd_routing_and_backward_op(device):
    p = gru_inputs(torch.float64, seed=8)
    gen = torch.Generator().manual_seed(9)
    gy, gh = rnd(gen, T, B, H), rnd(gen, T, B, H)
    # reference: nn.GRU autograd; output_h contributes through its last step only (gradh[T-1])
    ref = {k: v.clone().requires_grad_() for k, v in p.items()}
    mod = nn_module("gru", [ref["w_ih"], ref["w_hh"], ref["b_ih"], ref["b_hh"]], 1, False, True)
    ref_y, ref_h = mod(ref["x"], ref["hx"])
    leaves = [ref["x"], ref["hx"]] + list(mod._flat_weights)
    ex_x, ex_hx, ex_wih, ex_whh, ex_bih, ex_bhh = torch.autograd.grad((ref_y * gy).sum() + (ref_h[0] * gh[-1]).sum(),
                                                                      leaves)

    x, hx = p["x"].to(device).requires_grad_(), p["hx"].to(device).requires_grad_()
    w_in, w_hid = p["w_ih"].t().contiguous().to(device).requires_grad_(), \
        p["w_hh"].t().contiguous().to(device).requires_grad_()
    b_in, b_hid = p["b_ih"].to(device).requires_grad_(), p["b_hh"].to(device).requires_grad_()
    seq = torch.zeros(1, dtype=torch.int32, device=device)
    outs = torch_npu.npu_gru(x, hx, w_in, w_hid, b_in, b_hid, seq, True, 1, 0.0, True, False, False)
    got = torch.autograd.grad((outs[0] * gy.to(device)).sum() + (outs[1] * gh.to(device)).sum(),
                              [x, hx, w_in, w_hid, b_in, b_hid])
    for g, e in zip(got, (ex_x, ex_hx, ex_wih.t(), ex_whh.t(), ex_bih, ex_bhh)):
        close(g, e, 1e-10)

    grads = torch_npu.npu_gru_backward(gy.to(device), gh.to(device), x.detach(), w_in.detach(), w_hid.detach(),
                                       b_in.detach(), b_hid.detach(), seq, hx.detach(), *[o.detach() for o in outs])
    # (dw_input, dw_hidden, dx, db_input, db_hidden, dh_prev), the real op's order
    for g, e in zip(grads, (ex_wih.t(), ex_whh.t(), ex_x, ex_bih, ex_bhh, ex_hx)):
        assert tuple(g.shape) == tuple(e.shape)
        close(g, e, 1e-10)
    no_h = torch_npu.npu_gru_backward(gy.to(device), None, x.detach(), w_in.detach(), w_hid.detach(), b_in.detach(),
                                      b_hid.detach(), seq, hx.detach(), *[o.detach() for o in outs])
    zero_h = torch_npu.npu_gru_backward(gy.to(device), torch.zeros_like(gh).to(device), x.detach(), w_in.detach(),
                                        w_hid.detach(), b_in.detach(), b_hid.detach(), seq, hx.detach(),
                                        *[o.detach() for o in outs])
    for a, b in zip(no_h, zero_h):
        torch.testing.assert_close(a, b)


def test_npu_gru_gradcheck_float64():
    p = gru_inputs(torch.float64, seed=10)
    leaves = [t.clone().requires_grad_() for t in (p["x"][:3, :2], p["hx"][:, :2], p["w_ih"].t().contiguous(),
                                                   p["w_hh"].t().contiguous(), p["b_ih"], p["b_hh"])]
    seq = torch.zeros(1, dtype=torch.int32)

    def fn(*a):  # output_h's gradient is read at the last step only (as npu_gru_backward reads it)
        outs = torch_npu.npu_gru(*a, seq, True, 1, 0.0, True, False, False)
        return outs[0], outs[1][-1]

    assert torch.autograd.gradcheck(fn, leaves)


def test_npu_gru_output_formats():
    # the adapter allocates y, update, reset, new, hidden_new in FRACTAL_NZ and output_h in ND
    outs = run_npu_gru(gru_inputs(), "npu")
    assert [torch_npu.get_npu_format(t) for t in outs] == [29, 2, 29, 29, 29, 29]


# ----------------------------------------------------------------- FakeTensor shapes

def test_fake_tensor_shapes():
    num_layers, directions = 2, 2
    with FakeTensorMode():
        lstm_params, x, h0, c0 = make_params("lstm", num_layers, directions, True, seed=11)
        outs = npu._lstm_npu(x, [h0, c0], lstm_params, True, num_layers, 0.0, True, True)
        gate = (num_layers * directions, T, B, H)
        assert [tuple(t.shape) for t in outs] == [(T, B, 2 * H), h0.shape, c0.shape] + [gate] * 7
        dx, dhc, dps = npu._lstm_npu_backward(outs[0], outs[1], outs[2], x, [h0, c0], lstm_params, *outs[3:], True,
                                              num_layers, 0.0, True, True)
        assert dx.shape == x.shape and [t.shape for t in dhc] == [h0.shape, c0.shape]
        assert [t.shape for t in dps] == [p.shape for p in lstm_params]

        gru_params, x, h0, _ = make_params("gru", num_layers, directions, False, seed=12)
        outs = npu._gru_npu(x, h0, gru_params, False, num_layers, 0.0, True, True)
        assert [tuple(t.shape) for t in outs] == [(T, B, 2 * H), h0.shape] + [gate] * 5
        dx, dh, dps = npu._gru_npu_backward(outs[0], outs[1], x, h0, gru_params, *outs[2:], False, num_layers, 0.0,
                                            True, True)
        assert dx.shape == x.shape and dh.shape == h0.shape and [t.shape for t in dps] == [p.shape for p in gru_params]

        p = gru_inputs(torch.float16, torch.float32)
        outs = run_npu_gru(p, "npu")
        assert all(tuple(t.shape) == (T, B, H) and t.dtype == torch.float32 and t.device.type == "npu" for t in outs)
        on_npu = [t.to("npu") for t in (p["x"], p["w_ih"].t(), p["w_hh"].t(), p["b_ih"], p["b_hh"])]
        grads = torch_npu.npu_gru_backward(outs[0], outs[1], *on_npu, torch.zeros(1, device="npu"),
                                           p["hx"].to("npu"), *outs)
        assert [tuple(t.shape) for t in grads] == [(I, 3 * H), (H, 3 * H), (T, B, I), (3 * H,), (3 * H,), (1, B, H)]
        assert all(t.dtype == torch.float16 for t in grads)  # gradients follow input's dtype


# ----------------------------------------------------------------- errors

def test_not_established_modes_raise_naming_the_argument():
    params, x, h0, c0 = make_params("lstm", 2, 1, True, seed=13)
    with pytest.raises(NotImplementedError, match="batch_first=True"):
        npu._lstm_npu(x, [h0, c0], params, True, 2, 0.0, True, False, batch_first=True)
    with pytest.raises(NotImplementedError, match="batch_sizes"):
        npu._lstm_npu(x, [h0, c0], params, True, 2, 0.0, True, False, batch_sizes=torch.full((T,), B))
    with pytest.raises(NotImplementedError, match="dropout"):
        npu._lstm_npu(x, [h0, c0], params, True, 2, 0.3, True, False)
    # an empty batch_sizes is autograd's stand-in for None, as in the real adapters
    npu._lstm_npu(x, [h0, c0], params, True, 2, 0.0, True, False, batch_sizes=torch.empty(0))
    gparams, x, h0, _ = make_params("gru", 1, 1, True, seed=13)
    npu._gru_npu(x, h0, gparams, True, 1, 0.4, True, False)  # one layer: no dropout between layers
    with pytest.raises(NotImplementedError, match="batch_first=True"):
        npu._gru_npu(x, h0, gparams, True, 1, 0.0, True, False, batch_first=True)


def test_invalid_arguments_raise():
    params, x, h0, c0 = make_params("lstm", 1, 1, True, seed=14)
    with pytest.raises(RuntimeError, match="params must hold 8 tensors"):
        npu._lstm_npu(x, [h0, c0], params, True, 2, 0.0, True, False)
    with pytest.raises(RuntimeError, match="hx\\[0\\] must be"):
        npu._lstm_npu(x, [h0[:, :2], c0], params, True, 1, 0.0, True, False)
    with pytest.raises(RuntimeError, match="params\\[0\\] must be"):
        npu._lstm_npu(x[..., :3], [h0, c0], params, True, 1, 0.0, True, False)
    with pytest.raises(RuntimeError, match="bfloat16"):
        npu._lstm_npu(x.bfloat16(), [h0, c0], params, True, 1, 0.0, True, False)
    with pytest.raises(RuntimeError, match="input must be 3-D"):
        npu._gru_npu(x[0], h0, make_params("gru", 1, 1, True)[0], True, 1, 0.0, True, False)
    outs = npu._lstm_npu(x, [h0, c0], params, True, 1, 0.0, True, False)
    with pytest.raises(RuntimeError, match="i must be"):
        npu._lstm_npu_backward(outs[0], outs[1], outs[2], x, [h0, c0], params, outs[3][:, :2], *outs[4:], True, 1,
                               0.0, True, False)
    p = gru_inputs()
    args = [p["x"], p["hx"], p["w_ih"].t(), p["w_hh"].t(), p["b_ih"], p["b_hh"], torch.zeros(1)]
    with pytest.raises(RuntimeError, match="weight_hidden must be"):
        torch_npu.npu_gru(*args[:3], p["w_hh"], *args[4:], True, 1, 0.0, True, False, False)
    with pytest.raises(RuntimeError, match="bias_input must be 1-D"):
        torch_npu.npu_gru(*args[:4], p["b_ih"][:-1], *args[5:], True, 1, 0.0, True, False, False)
    with pytest.raises(RuntimeError, match="hx must be"):
        torch_npu.npu_gru(args[0], p["hx"][:, :2], *args[2:], True, 1, 0.0, True, False, False)
    with pytest.raises(RuntimeError, match="float16 or float32"):
        torch_npu.npu_gru(args[0].bfloat16(), *args[1:], True, 1, 0.0, True, False, False)
