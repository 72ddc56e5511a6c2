"""nn.LSTM / nn.GRU / nn.RNN and their cells on npu are bitwise equal to CPU,
forward and backward (input, initial states and every weight), in every
configuration nn exposes: layers, bidirectional, batch_first, packed
sequences, proj_size, bf16, missing initial states, partial requires_grad.
Dropout between layers draws from the npu generator."""
import copy

import pytest
import torch
import torch.nn as nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import torch_npu  # noqa: F401

T, B, I, H = 5, 3, 4, 6

KINDS = {
    "lstm": lambda **kw: nn.LSTM(I, H, **kw),
    "gru": lambda **kw: nn.GRU(I, H, **kw),
    "rnn_tanh": lambda **kw: nn.RNN(I, H, nonlinearity="tanh", **kw),
    "rnn_relu": lambda **kw: nn.RNN(I, H, nonlinearity="relu", **kw),
}


def _pair(kind, dtype=torch.float32, seed=0, **kw):
    torch.manual_seed(seed)
    cpu = KINDS[kind](**kw).to(dtype)
    return cpu, copy.deepcopy(cpu).npu()


def _states(kind, mod, dtype, seed=1):
    g = torch.Generator().manual_seed(seed)
    d = 2 if mod.bidirectional else 1
    hs = mod.proj_size if getattr(mod, "proj_size", 0) else H
    h0 = torch.randn(mod.num_layers * d, B, hs, generator=g).to(dtype)
    if kind == "lstm":
        return (h0, torch.randn(mod.num_layers * d, B, H, generator=g).to(dtype))
    return h0


def _flat(obj):
    if obj is None:
        return []
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, torch.nn.utils.rnn.PackedSequence):
        return [obj.data]
    if isinstance(obj, (tuple, list)):
        return [t for o in obj for t in _flat(o)]
    return []


def _to_npu(obj):
    if isinstance(obj, torch.Tensor):
        return obj.detach().npu().requires_grad_(obj.requires_grad)
    return tuple(_to_npu(o) for o in obj)


def _leaf(obj, requires_grad=True):
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone().requires_grad_(requires_grad)
    return tuple(_leaf(o, requires_grad) for o in obj)


def _cotangents(outs, seed=7):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(o.shape, generator=g).to(o.dtype) for o in outs]


def _run(mod, x, state, cot):
    out = mod(x) if state is None else mod(x, state)
    outs = _flat(out)
    loss = sum((o.float() * c.to(o.device).float()).sum() for o, c in zip(outs, cot))
    loss.backward()
    return outs


def _assert_same(cpu_tensors, npu_tensors):
    assert len(cpu_tensors) == len(npu_tensors)
    for c, n in zip(cpu_tensors, npu_tensors):
        if c is None:
            assert n is None
            continue
        assert n.device.type == "npu" and n.dtype == c.dtype and n.shape == c.shape
        assert torch.equal(n.cpu(), c), (n.cpu() - c).abs().max()


def _check_module(kind, dtype=torch.float32, with_state=True, **kw):
    cpu, npu = _pair(kind, dtype, **kw)
    shape = (B, T, I) if kw.get("batch_first") else (T, B, I)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(3)).to(dtype).requires_grad_()
    state = _leaf(_states(kind, cpu, dtype)) if with_state else None
    with torch.no_grad():
        cot = _cotangents(_flat(cpu(x) if state is None else cpu(x, state)))
    xn = _to_npu(x)
    sn = _to_npu(state) if state is not None else None
    outs_c = _run(cpu, x, state, cot)
    outs_n = _run(npu, xn, sn, cot)
    _assert_same(outs_c, outs_n)
    _assert_same([x.grad] + [s.grad for s in _flat(state)], [xn.grad] + [s.grad for s in _flat(sn)])
    _assert_same([p.grad for p in cpu.parameters()], [p.grad for p in npu.parameters()])


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("num_layers", [1, 2])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("batch_first", [False, True])
def test_modules_fp32_forward_and_all_grads(kind, num_layers, bidirectional, batch_first):
    _check_module(kind, num_layers=num_layers, bidirectional=bidirectional, batch_first=batch_first)


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("bidirectional", [False, True])
def test_modules_bf16_and_without_initial_state(kind, bidirectional):
    _check_module(kind, torch.bfloat16, num_layers=2, bidirectional=bidirectional)
    _check_module(kind, torch.float32, with_state=False, num_layers=2, bidirectional=bidirectional)
    _check_module(kind, torch.bfloat16, with_state=False, num_layers=1, bidirectional=bidirectional)


@pytest.mark.parametrize("kind", list(KINDS))
def test_modules_without_bias(kind):
    _check_module(kind, num_layers=2, bidirectional=True, bias=False)


@pytest.mark.parametrize("num_layers", [1, 2])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lstm_proj_size(num_layers, bidirectional, dtype):
    _check_module("lstm", dtype, num_layers=num_layers, bidirectional=bidirectional, proj_size=4)
    _check_module("lstm", dtype, with_state=False, num_layers=num_layers, bidirectional=bidirectional, proj_size=4)


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("enforce_sorted", [True, False])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_packed_sequences(kind, enforce_sorted, bidirectional):
    cpu, npu = _pair(kind, num_layers=2, bidirectional=bidirectional)
    lengths = torch.tensor([5, 3, 2]) if enforce_sorted else torch.tensor([3, 5, 2])
    x = torch.randn(T, B, I, generator=torch.Generator().manual_seed(4)).requires_grad_()
    state = _leaf(_states(kind, cpu, torch.float32))
    xn, sn = _to_npu(x), _to_npu(state)

    def run(mod, inp, st):
        packed = pack_padded_sequence(inp, lengths, enforce_sorted=enforce_sorted)
        out, hidden = mod(packed, st)
        padded, out_lengths = pad_packed_sequence(out)
        assert torch.equal(out_lengths, lengths)
        outs = [padded] + _flat(hidden)
        cot = _cotangents([o.detach().cpu() for o in outs])
        sum((o * c.to(o.device)).sum() for o, c in zip(outs, cot)).backward()
        return outs

    _assert_same(run(cpu, x, state), run(npu, xn, sn))
    _assert_same([x.grad] + [s.grad for s in _flat(state)], [xn.grad] + [s.grad for s in _flat(sn)])
    _assert_same([p.grad for p in cpu.parameters()], [p.grad for p in npu.parameters()])


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_autograd_grad_with_requires_grad_on_some_inputs(kind):
    cpu, npu = _pair(kind, num_layers=2, bidirectional=True)
    for p in list(cpu.parameters())[::2]:
        p.requires_grad_(False)
    for p in list(npu.parameters())[::2]:
        p.requires_grad_(False)
    x = torch.randn(T, B, I, generator=torch.Generator().manual_seed(5))  # no grad for the input
    state = _states(kind, cpu, torch.float32)
    h0 = (state[0] if kind == "lstm" else state).clone().requires_grad_()
    rest = (state[1],) if kind == "lstm" else ()
    h0n = h0.detach().npu().requires_grad_()
    restn = tuple(r.npu() for r in rest)

    def grads(mod, inp, h, extra):
        out, hidden = mod(inp, (h,) + extra if extra else h)
        wanted = [h] + [p for p in mod.parameters() if p.requires_grad]
        cot = _cotangents([out.detach().cpu()])
        return torch.autograd.grad((out * cot[0].to(out.device)).sum(), wanted)

    _assert_same(list(grads(cpu, x, h0, rest)), list(grads(npu, x.npu(), h0n, restn)))


def test_only_weights_require_grad_and_unused_outputs():
    cpu, npu = _pair("lstm", num_layers=2)
    x = torch.randn(T, B, I)
    _, (hc, _) = cpu(x)
    _, (hn, _) = npu(x.npu())
    hc.sum().backward()  # only h_n reaches the loss: output and c_n get no gradient
    hn.sum().backward()
    _assert_same([p.grad for p in cpu.parameters()], [p.grad for p in npu.parameters()])


def test_retain_graph_second_backward_and_backward_twice_error():
    cpu, npu = _pair("gru", num_layers=2)
    x = torch.randn(T, B, I)
    oc, _ = cpu(x)
    on, _ = npu(x.npu())
    for out in (oc, on):
        out.sum().backward(retain_graph=True)
        out.sum().backward()
    _assert_same([p.grad for p in cpu.parameters()], [p.grad for p in npu.parameters()])
    with pytest.raises(RuntimeError, match="Trying to backward through the graph a second time"):
        on.sum().backward()


def test_inplace_change_of_a_weight_before_backward_is_detected():
    _, npu = _pair("lstm")
    out, _ = npu(torch.randn(T, B, I).npu())
    with torch.no_grad():
        npu.weight_hh_l0.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


@pytest.mark.parametrize("kind", list(KINDS))
def test_no_grad_and_inference_mode(kind):
    cpu, npu = _pair(kind, num_layers=2, bidirectional=True)
    x = torch.randn(T, B, I)
    ref = _flat(cpu(x))
    with torch.no_grad():
        _assert_same(ref, _flat(npu(x.npu())))
    with torch.inference_mode():
        _assert_same(ref, _flat(npu(x.npu())))


CELLS = {
    "lstm": lambda bias: nn.LSTMCell(I, H, bias=bias),
    "gru": lambda bias: nn.GRUCell(I, H, bias=bias),
    "rnn_tanh": lambda bias: nn.RNNCell(I, H, bias=bias, nonlinearity="tanh"),
    "rnn_relu": lambda bias: nn.RNNCell(I, H, bias=bias, nonlinearity="relu"),
}


@pytest.mark.parametrize("kind", list(CELLS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("with_state", [True, False])
def test_cells(kind, dtype, bias, with_state):
    torch.manual_seed(0)
    cpu = CELLS[kind](bias).to(dtype)
    npu = copy.deepcopy(cpu).npu()
    g = torch.Generator().manual_seed(2)
    x = torch.randn(B, I, generator=g).to(dtype).requires_grad_()
    state = None
    if with_state:
        h = torch.randn(B, H, generator=g).to(dtype)
        state = _leaf((h, torch.randn(B, H, generator=g).to(dtype)) if kind == "lstm" else h)
    xn = _to_npu(x)
    sn = _to_npu(state) if state is not None else None
    with torch.no_grad():
        cot = _cotangents(_flat(cpu(x) if state is None else cpu(x, state)))
    _assert_same(_run(cpu, x, state, cot), _run(npu, xn, sn, cot))
    _assert_same([x.grad] + [s.grad for s in _flat(state)], [xn.grad] + [s.grad for s in _flat(sn)])
    _assert_same([p.grad for p in cpu.parameters()], [p.grad for p in npu.parameters()])


# ------------------------------------------------------------------ dropout

def _dropout_run(kind, seed, train=True):
    _, npu = _pair(kind, num_layers=3, dropout=0.5, bidirectional=True)
    npu.train(train)
    x = torch.randn(T, B, I, generator=torch.Generator().manual_seed(6)).npu().requires_grad_()
    torch.npu.manual_seed(seed)
    outs = _flat(npu(x))
    sum(o.sum() for o in outs).backward()
    return [o.detach().cpu() for o in outs] + [x.grad.cpu()] + [p.grad.cpu() for p in npu.parameters()]


@pytest.mark.parametrize("kind", ["lstm", "gru", "rnn_tanh"])
def test_dropout_between_layers_follows_the_npu_seed(kind):
    a, b, c = _dropout_run(kind, 123), _dropout_run(kind, 123), _dropout_run(kind, 321)
    assert all(torch.equal(p, q) for p, q in zip(a, b))
    assert not torch.equal(a[0], c[0])
    # torch.manual_seed (CPU) does not decide the npu masks
    torch.manual_seed(999)
    d = _dropout_run(kind, 123)
    assert all(torch.equal(p, q) for p, q in zip(a, d))


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_dropout_layers_equal_cpu_layers_with_npu_dropout_between(kind):
    """Reference: each layer on CPU, the mask drawn by npu dropout between them."""
    layers, p = 3, 0.5
    cpu, npu = _pair(kind, num_layers=layers, dropout=p)
    x = torch.randn(T, B, I, generator=torch.Generator().manual_seed(8))
    torch.npu.manual_seed(5)
    out_n, _ = npu(x.npu())

    torch.npu.manual_seed(5)
    inp = x
    for layer in range(layers):
        single = KINDS[kind](num_layers=1)
        single.input_size = inp.shape[-1]
        with torch.no_grad():
            single.weight_ih_l0 = nn.Parameter(getattr(cpu, f"weight_ih_l{layer}").detach().clone())
            single.weight_hh_l0 = nn.Parameter(getattr(cpu, f"weight_hh_l{layer}").detach().clone())
            single.bias_ih_l0 = nn.Parameter(getattr(cpu, f"bias_ih_l{layer}").detach().clone())
            single.bias_hh_l0 = nn.Parameter(getattr(cpu, f"bias_hh_l{layer}").detach().clone())
        single._flat_weights = [single.weight_ih_l0, single.weight_hh_l0, single.bias_ih_l0, single.bias_hh_l0]
        inp, _ = single(inp)
        if layer + 1 < layers:
            inp = nn.functional.dropout(inp.detach().npu(), p, training=True).cpu()
    assert torch.equal(out_n.detach().cpu(), inp.detach())


def test_dropout_in_eval_mode_equals_cpu():
    cpu, npu = _pair("lstm", num_layers=3, dropout=0.5)
    cpu.eval()
    npu.eval()
    x = torch.randn(T, B, I)
    _assert_same(_flat(cpu(x)), _flat(npu(x.npu())))


# ------------------------------------------------------------------ other paths

def test_compiled_lstm_model_matches_eager():
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = nn.LSTM(I, H, num_layers=2)
            self.head = nn.Linear(H, 2)

        def forward(self, x):
            out, _ = self.rnn(x)
            return self.head(out).relu()

    torch.manual_seed(0)
    eager = Model().npu()
    compiled_model = copy.deepcopy(eager)
    compiled = torch.compile(compiled_model, backend="npu")
    x = torch.randn(T, B, I).npu()
    ref, got = eager(x), compiled(x)
    assert got.device.type == "npu" and torch.equal(ref, got)
    ref.sum().backward()
    got.sum().backward()
    _assert_same([p.grad.cpu() for p in eager.parameters()], [p.grad for p in compiled_model.parameters()])


def test_compile_with_allow_rnn_traces_through_the_decomposition():
    """With dynamo's allow_rnn the RNN is traced (torch's decomposition, as on
    any device) and differentiable; close to eager, not bitwise (other op order)."""
    import torch._dynamo

    torch.manual_seed(0)
    eager = nn.GRU(I, H, num_layers=2, bidirectional=True).npu()
    model = copy.deepcopy(eager)
    x = torch.randn(T, B, I).npu()
    with torch._dynamo.config.patch(allow_rnn=True):
        torch._dynamo.reset()
        got, _ = torch.compile(model, backend="npu")(x)
    ref, _ = eager(x)
    assert got.device.type == "npu" and torch.allclose(got, ref, atol=1e-5)
    got.sum().backward()
    ref.sum().backward()
    for p, q in zip(model.parameters(), eager.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-4)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_autocast_leaves_lstm_and_gru_in_their_dtype(kind):
    """torch_npu's autocast list (autocast_policy.tsv) has no rule for the
    multi-layer LSTM/GRU, which have their own npu kernels on the device: under
    autocast they run in the dtype they are given, equal to the CPU module."""
    cpu, npu = _pair(kind, num_layers=2, bidirectional=True)
    x = torch.randn(T, B, I)
    with torch.autocast("npu", dtype=torch.bfloat16):
        got = _flat(npu(x.npu()))
    assert all(t.dtype == torch.float32 for t in got)
    _assert_same(_flat(cpu(x)), got)


@pytest.mark.parametrize("kind", ["rnn_tanh", "rnn_relu"])
def test_autocast_runs_rnn_tanh_and_relu_through_their_cast_linears(kind):
    """rnn_tanh/rnn_relu have no npu kernel on the device: ATen's composite runs,
    and its linears are on the lower-precision list, so the cells compute in
    bf16, as the CPU module converted to bf16 does."""
    cpu, npu = _pair(kind, num_layers=2, bidirectional=True)
    x = torch.randn(T, B, I)
    with torch.autocast("npu", dtype=torch.bfloat16):
        got = _flat(npu(x.npu()))
    assert all(t.dtype == torch.bfloat16 for t in got)
    ref = _flat(copy.deepcopy(cpu).to(torch.bfloat16)(x.to(torch.bfloat16)))
    _assert_same(ref, got)


def test_mixed_devices_raise():
    _, npu = _pair("gru")
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        npu(torch.randn(T, B, I).npu(), torch.zeros(1, B, H))


def test_no_device_memory_left_behind():
    """The CPU graph a call records lives in device memory and goes with the npu graph."""
    _, npu = _pair("lstm", num_layers=2, bidirectional=True)

    def step():
        out, hidden = npu(torch.randn(T, B, I).npu().requires_grad_())
        out.sum().backward()

    step()  # parameters and their gradients now exist
    steady = torch.npu.memory_allocated()
    for _ in range(3):
        step()
        assert torch.npu.memory_allocated() == steady
    out, hidden = npu(torch.randn(T, B, I).npu())
    assert torch.npu.memory_allocated() > steady  # the recorded graph
    del out, hidden
    assert torch.npu.memory_allocated() == steady
