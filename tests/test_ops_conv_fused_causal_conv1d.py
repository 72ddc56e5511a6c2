"""npu_fused_causal_conv1d / npu_fused_causal_conv1d_v2 against a reference written here.

The reference walks each sequence token by token in float64 with a Python list as the
sequence's running context: the left context comes from its cache line (zeros on the first
chunk, a window chosen by num_accepted_tokens for speculative decoding, else the newest K-1
rows), each token's output is the dot product of the weight with the last K rows seen, the
cache line keeps the newest rows, and with prefix caching the context at every completed
block boundary (absolute token count a multiple of block_size) goes to that block's line.
It never calls the implementation. CPU and npu, float32 / float16 / bfloat16, FakeTensor,
error cases.
"""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_npu

from _op_helpers import DEVICES

K = 3
DIM = 64
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def rand(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)


def i32(values, device="cpu"):
    return torch.tensor(values, dtype=torch.int32, device=device)


def reference(x, weight, conv_states, seq_lens=None, lines=None, accepted=None, computed=None, apc=None,
              pad=-1, residual=False, pangu=False):
    """Returns (y, conv_states) in float64. ``apc``: dict(table, init, last, block_size)."""
    w = weight.double()
    cache = [[row.clone() for row in line] for line in conv_states.double()]  # Python lists of rows
    state_len = conv_states.shape[1]
    xd = x.double()
    if x.dim() == 3:
        seqs = [xd[b] for b in range(x.shape[0])]
    else:
        starts = [sum(seq_lens[:b]) for b in range(len(seq_lens))]
        seqs = [xd[s:s + n] for s, n in zip(starts, seq_lens)]
    outputs = []
    for b, seq in enumerate(seqs):
        if apc is not None:
            read, write = apc["table"][b][apc["init"][b]], apc["table"][b][apc["last"][b]]
        elif lines is not None:
            read = write = lines[b]
        else:
            read = write = b
        if read == pad:
            outputs.append(torch.zeros_like(seq))
            continue
        if computed is not None and computed[b] == 0:
            context = [torch.zeros(x.shape[-1], dtype=torch.float64) for _ in range(K - 1)]
        elif accepted is not None:
            context = list(cache[read][:accepted[b] - 1 + K - 1])
        else:
            context = list(cache[read])
        out = []
        for t, token in enumerate(seq):
            context.append(token)
            value = sum(w[k] * context[len(context) - K + k] for k in range(K))
            if pangu and computed[b] + t < K - 1:  # no full history yet in this sequence's life
                value = torch.zeros_like(value)
            out.append(value + token if residual else value)
            if apc is not None and t < len(seq) - 1:
                done = computed[b] + t + 1
                if done % apc["block_size"] == 0:  # a block completed inside this chunk
                    line = apc["table"][b][done // apc["block_size"] - 1]
                    cache[line][state_len - (K - 1):] = context[len(context) - (K - 1):]
        keep = min(state_len, len(context))
        cache[write][state_len - keep:] = context[len(context) - keep:]
        outputs.append(torch.stack(out))
    y = torch.stack(outputs) if x.dim() == 3 else torch.cat(outputs)
    return y, torch.stack([torch.stack(line) for line in cache])


def close(actual, expected, dtype, scale=2.0):
    tol = TOL[dtype] * max(1.0, float(expected.abs().max())) * scale
    torch.testing.assert_close(actual.cpu().double(), expected, atol=tol, rtol=0)


def same_states(actual, expected):
    # the cache only ever receives copies of input rows: exact
    torch.testing.assert_close(actual.cpu().double(), expected, atol=0, rtol=0)


def run(device, x, weight, states, **kwargs):
    kw = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
    states_dev = states.clone().to(device)
    y = torch_npu.npu_fused_causal_conv1d(x.to(device), weight.to(device), states_dev, **kw)
    assert y.device.type == device and y.dtype == x.dtype and y.shape == x.shape
    assert states_dev.device.type == device
    return y, states_dev


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("residual", [0, 1])
def test_prefill_varlen(device, dtype, residual):
    lens, lines, computed = [5, 3, 7, 4], [0, 3, 1, 5], [4, 2, 0, 0]
    x, w, states = rand((sum(lens), DIM), dtype, 1), rand((K, DIM), dtype, 2), rand((8, K - 1, DIM), dtype, 3)
    y, new_states = run(device, x, w, states, query_start_loc=i32([0, 5, 8, 15, 19]), cache_indices=i32(lines),
                        num_computed_tokens=i32(computed), residual_connection=residual, max_query_len=7)
    ry, rs = reference(x, w, states, lens, lines, computed=computed, residual=bool(residual))
    close(y, ry, dtype)
    same_states(new_states, rs)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_mixed_prefill_decode_speculative(device, dtype):
    m = 2
    lens, lines, computed, accepted = [6, 5, 2, 1], [0, 3, 1, 5], [0, 20, 50, 30], [1, 2, 2, 1]
    x, w, states = rand((sum(lens), DIM), dtype, 4), rand((K, DIM), dtype, 5), rand((8, K - 1 + m, DIM), dtype, 6)
    y, new_states = run(device, x, w, states, query_start_loc=i32([0, 6, 11, 13, 14]), cache_indices=i32(lines),
                        num_computed_tokens=i32(computed), num_accepted_tokens=i32(accepted))
    ry, rs = reference(x, w, states, lens, lines, accepted=accepted, computed=computed)
    close(y, ry, dtype)
    same_states(new_states, rs)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_fixed_batch_pangu_residual(device, dtype):
    m = 2
    lines, computed, accepted = [0, 2, 4, 6], [1, 50, 0, 30], [2, 1, 3, 2]
    x, w, states = rand((4, m + 1, DIM), dtype, 7), rand((K, DIM), dtype, 8), rand((8, K - 1 + m, DIM), dtype, 9)
    y, new_states = run(device, x, w, states, cache_indices=i32(lines), num_computed_tokens=i32(computed),
                        num_accepted_tokens=i32(accepted), conv_mode="pangu", residual_connection=1)
    ry, rs = reference(x, w, states, lines=lines, accepted=accepted, computed=computed, residual=True, pangu=True)
    close(y, ry, dtype)
    same_states(new_states, rs)
    # pangu: the first K-1-computed outputs of a sequence are the residual alone
    torch.testing.assert_close(y[2, :2].cpu(), x[2, :2])


@pytest.mark.parametrize("device", DEVICES)
def test_default_mode_reads_newest_rows_of_a_long_state(device):
    dtype, lens = torch.float32, [1, 2, 1]
    x, w, states = rand((4, DIM), dtype, 10), rand((K, DIM), dtype, 11), rand((3, 5, DIM), dtype, 12)
    y, new_states = run(device, x, w, states, query_start_loc=i32([0, 1, 3, 4]))  # line b for sequence b
    ry, rs = reference(x, w, states, lens)
    close(y, ry, dtype)
    same_states(new_states, rs)
    # the cache line slid by the sequence's length: its newest row is the last token
    same_states(new_states[1, -1], x[2].double())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pad", [-1, 6])
def test_pad_slot_sequences_are_skipped(device, pad):
    dtype, lens, lines = torch.bfloat16, [3, 4, 2], [2, pad, 0]
    x, w, states = rand((9, DIM), dtype, 13), rand((K, DIM), dtype, 14), rand((7, K - 1, DIM), dtype, 15)
    y, new_states = run(device, x, w, states, query_start_loc=i32([0, 3, 7, 9]), cache_indices=i32(lines),
                        pad_slot_id=pad, num_computed_tokens=i32([3, 3, 0]))
    ry, rs = reference(x, w, states, lens, lines, computed=[3, 3, 0], pad=pad)
    close(y, ry, dtype)
    same_states(new_states, rs)
    assert not y[3:7].cpu().any()  # skipped rows are zero here (unspecified on hardware)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefix_caching_fills_block_lines(device, dtype):
    bs, lens, computed = 4, [8, 6, 3], [0, 5, 2]
    first = [c // bs for c in computed]
    last = [(c + n - 1) // bs for c, n in zip(computed, lens)]
    init = [0, 2, 1]  # where each sequence's context is read (allowed: <= first + 1 and <= last)
    table = [[0, 1, 2, 9, 10], [3, 4, 5, 11, 12], [6, 7, 8, 13, 14]]
    x, w, states = rand((sum(lens), DIM), dtype, 16), rand((K, DIM), dtype, 17), rand((16, K - 1, DIM), dtype, 18)
    y, new_states = run(device, x, w, states, query_start_loc=i32([0, 8, 14, 17]), cache_indices=i32(table),
                        num_computed_tokens=i32(computed), block_idx_first_scheduled_token=i32(first),
                        block_idx_last_scheduled_token=i32(last), initial_state_idx=i32(init), block_size=bs,
                        residual_connection=1, max_query_len=8)
    ry, rs = reference(x, w, states, lens, computed=computed, residual=True,
                       apc=dict(table=table, init=init, last=last, block_size=bs))
    close(y, ry, dtype)
    same_states(new_states, rs)
    same_states(new_states[0], x[2:4].double())  # block 0 of sequence 0 ends after its 4th token
    same_states(new_states[15], states[15].double())  # unused line untouched


@pytest.mark.parametrize("device", DEVICES)
def test_v2_writes_x_in_place(device):
    dtype, lens, lines, computed = torch.float16, [5, 3, 4], [4, -1, 1], [2, 0, 0]
    x, w, states = rand((12, DIM), dtype, 19), rand((K, DIM), dtype, 20), rand((6, K - 1, DIM), dtype, 21)
    x_dev, states_dev = x.clone().to(device), states.clone().to(device)
    result = torch.ops.npu.npu_fused_causal_conv1d_v2(
        x_dev, w.to(device), states_dev, query_start_loc=i32([0, 5, 8, 12], device),
        cache_indices=i32(lines, device), num_computed_tokens=i32(computed, device), residual_connection=1)
    assert result is None
    ry, rs = reference(x, w, states, lens, lines, computed=computed, residual=True)
    close(x_dev[:5], ry[:5], dtype)
    close(x_dev[8:], ry[8:], dtype)
    torch.testing.assert_close(x_dev[5:8].cpu(), x[5:8])  # the skipped sequence keeps its input
    same_states(states_dev, rs)


def test_documented_no_effect_arguments_are_ignored():
    dtype = torch.bfloat16
    x, w, states = rand((6, DIM), dtype, 22), rand((K, DIM), dtype, 23), rand((2, K - 1, DIM), dtype, 24)
    base_y, base_s = run("cpu", x, w, states, query_start_loc=i32([0, 2, 6]))
    y, s = run("cpu", x, w, states, query_start_loc=i32([0, 2, 6]), initial_state_mode=i32([0, 2]),
               bias=rand((DIM,), dtype, 25), activation="silu", run_mode=1)
    assert torch.equal(y, base_y) and torch.equal(s, base_s)


def test_fake_and_meta_shapes():
    dtype = torch.bfloat16
    with FakeTensorMode():
        states = torch.empty(8, K - 1, DIM, dtype=dtype)
        y = torch_npu.npu_fused_causal_conv1d(torch.empty(19, DIM, dtype=dtype), torch.empty(K, DIM, dtype=dtype),
                                              states, query_start_loc=torch.empty(5, dtype=torch.int32),
                                              cache_indices=torch.empty(4, dtype=torch.int32))
        assert y.shape == (19, DIM) and y.dtype == dtype and states.shape == (8, K - 1, DIM)
        x3 = torch.empty(4, 3, DIM, dtype=torch.float16)
        assert torch.ops.npu.npu_fused_causal_conv1d_v2(
            x3, torch.empty(K, DIM, dtype=torch.float16), torch.empty(4, K + 1, DIM, dtype=torch.float16)) is None
    y = torch_npu.npu_fused_causal_conv1d(torch.empty(2, 5, DIM, device="meta"), torch.empty(K, DIM, device="meta"),
                                          torch.empty(2, K + 3, DIM, device="meta"))
    assert y.shape == (2, 5, DIM) and y.device.type == "meta"


def _base():
    return dict(x=rand((6, DIM), torch.float16, 26), weight=rand((K, DIM), torch.float16, 27),
                conv_states=rand((4, K - 1, DIM), torch.float16, 28), query_start_loc=i32([0, 2, 6]))


@pytest.mark.parametrize("change, error, match", [
    (dict(weight=rand((4, DIM), torch.float16, 0)), RuntimeError, "weight must be"),
    (dict(x=rand((6, 40), torch.float16, 0)), RuntimeError, "multiple of 16"),
    (dict(conv_states=rand((4, K - 1, DIM), torch.bfloat16, 0)), RuntimeError, "x's dtype"),
    (dict(query_start_loc=None), RuntimeError, "query_start_loc is required"),
    (dict(query_start_loc=torch.tensor([0, 2, 6])), RuntimeError, "int32"),
    (dict(query_start_loc=i32([0, 2, 2])), RuntimeError, "strictly increasing"),
    (dict(query_start_loc=i32([0, 2, 9])), RuntimeError, "cu_seq_len"),
    (dict(cache_indices=i32([1, 1])), RuntimeError, "distinct"),
    (dict(cache_indices=i32([0, 4])), RuntimeError, "outside conv_states"),
    (dict(conv_mode="pangu"), RuntimeError, "num_computed_tokens is required"),
    (dict(conv_mode="mamba2"), NotImplementedError, "conv_mode"),
    (dict(num_accepted_tokens=i32([1, 2])), RuntimeError, "num_accepted_tokens=2"),
    (dict(num_accepted_tokens=i32([0, 1])), RuntimeError, "num_accepted_tokens=0"),
    (dict(block_idx_first_scheduled_token=i32([0, 0])), RuntimeError, "required when prefix caching"),
    (dict(max_query_len=3), RuntimeError, "max_query_len"),
    (dict(residual_connection=2), RuntimeError, "residual_connection"),
])
def test_errors(change, error, match):
    args = _base()
    args.update(change)
    x, w, s = args.pop("x"), args.pop("weight"), args.pop("conv_states")
    with pytest.raises(error, match=match):
        torch_npu.npu_fused_causal_conv1d(x, w, s, **args)


def test_apc_block_indices_are_validated():
    args = _base()
    x, w, s = args.pop("x"), args.pop("weight"), args.pop("conv_states")
    apc = dict(cache_indices=i32([[0, 1], [2, 3]]), num_computed_tokens=i32([0, 0]),
               block_idx_first_scheduled_token=i32([0, 0]), initial_state_idx=i32([0, 0]), block_size=4)
    with pytest.raises(RuntimeError, match="block_idx_last"):
        torch_npu.npu_fused_causal_conv1d(x, w, s, block_idx_last_scheduled_token=i32([0, 2]), **apc, **args)
    with pytest.raises(RuntimeError, match="do not fit"):  # 2 tokens cannot complete block 0 of size 4
        torch_npu.npu_fused_causal_conv1d(x, w, s, block_idx_last_scheduled_token=i32([1, 0]), **apc, **args)


def test_traced_and_compiled_graphs_carry_the_computation():
    # no shape-only shortcut: a graph traced with fake tensors updates the cache and the output
    from torch.fx.experimental.proxy_tensor import make_fx

    def step(x, w, s, q, c, n):
        return torch_npu.npu_fused_causal_conv1d(x, w, s, query_start_loc=q, cache_indices=c, num_computed_tokens=n,
                                                 residual_connection=1)

    lens, lines, computed = [4, 5], [3, 1], [2, 0]
    x, w, states = rand((9, DIM), torch.bfloat16, 29), rand((K, DIM), torch.bfloat16, 30), \
        rand((5, K - 1, DIM), torch.bfloat16, 31)
    args = (i32([0, 4, 9]), i32(lines), i32(computed))
    ry, rs = reference(x, w, states, lens, lines, computed=computed, residual=True)
    graph = make_fx(step, tracing_mode="fake")(x, w, states.clone(), *args)
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    for fn in (graph, compiled):
        s = states.clone()
        y = fn(x, w, s, *args)
        close(y, ry, torch.bfloat16)
        same_states(s, rs)


@pytest.mark.parametrize("device", DEVICES)
def test_non_contiguous_x_and_conv_states(device):
    dtype, lens, lines, computed = torch.float16, [3, 4], [2, 0], [1, 0]
    x_big, states_big = rand((7, 2 * DIM), dtype, 32).to(device), rand((6, K - 1, DIM), dtype, 33).to(device)
    x, states = x_big[:, DIM:], states_big[::2]  # token stride 2*DIM; every other cache line
    w = rand((K, DIM), dtype, 34)
    ry, rs = reference(x.cpu(), w, states.cpu(), lens, lines, computed=computed)
    y = torch_npu.npu_fused_causal_conv1d(x, w.to(device), states, query_start_loc=i32([0, 3, 7], device),
                                          cache_indices=i32(lines, device), num_computed_tokens=i32(computed, device))
    close(y, ry, dtype)
    same_states(states, rs)
    same_states(states_big[1::2], rand((6, K - 1, DIM), dtype, 33)[1::2].double())  # lines in between untouched
