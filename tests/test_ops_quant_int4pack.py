"""npu_convert_weight_to_int4pack and the int32-packed int4 weight path of
npu_weight_quant_batchmatmul.

References are written here: a bit-twiddling loop over Python ints for the packing rule of the
torch_npu doc / op-plugin golden (element j of each group of 8 in bits 4j..4j+3, value & 0xF),
and the documented antiquant formula ``x @ ((w + antiquant_offset) * antiquant_scale) + bias``
in float64 on the unpacked int4 values the test generated itself."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_npu

from _op_helpers import DEVICES


# (x dtype, rtol): the result is rounded once to x.dtype from a float32 matmul
OUT = [(torch.float16, 2e-3), (torch.bfloat16, 1.6e-2)]


def loop_pack(values):
    """int4 values (2-d int tensor) -> list of rows of signed int32 words, by Python bit twiddling."""
    rows = []
    for row in values.tolist():
        words = []
        for g in range(0, len(row), 8):
            word = 0
            for j in range(8):
                word |= (row[g + j] & 0xF) << (4 * j)
            if word >= 1 << 31:
                word -= 1 << 32
            words.append(word)
        rows.append(words)
    return rows


def loop_unpack(words):
    """Rows of int32 words -> rows of int4 values in [-8, 7] (low nibble first)."""
    rows = []
    for row in words:
        out = []
        for word in row:
            for j in range(8):
                nib = (word >> (4 * j)) & 0xF
                out.append(nib - 16 if nib >= 8 else nib)
        rows.append(out)
    return rows


def int4(shape, gen):
    return torch.randint(-8, 8, shape, generator=gen, dtype=torch.int32)


@pytest.mark.parametrize("device", DEVICES)
def test_pack_known_word(device):
    w = torch.tensor([[1, 2, 3, 4, 5, 6, 7, -8], [-1, 0, 0, 0, 0, 0, 0, 0]], dtype=torch.int32)
    out = torch_npu.npu_convert_weight_to_int4pack(w.to(device))
    assert out.device.type == device and out.dtype == torch.int32 and out.shape == (2, 1)
    # 0x87654321 as int32, and 0x0000000F
    assert out.cpu().tolist() == [[0x87654321 - (1 << 32)], [0xF]]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(1, 8), (5, 16), (64, 32), (3, 120)])
def test_pack_matches_bit_loop(device, shape):
    gen = torch.Generator().manual_seed(shape[0] * 131 + shape[1])
    w = int4(shape, gen)
    out = torch_npu.npu_convert_weight_to_int4pack(w.to(device))
    assert out.shape == (shape[0], shape[1] // 8)
    assert out.cpu().tolist() == loop_pack(w)
    # round trip through the test's own decoder
    assert loop_unpack(out.cpu().tolist()) == w.tolist()


@pytest.mark.parametrize("device", DEVICES)
def test_out_of_range_values_wrap_like_the_masking_adapter(device):
    # the real adapter keeps value & 0xF without a range check: 9 -> -7, -9 -> 7, 16 -> 0
    w = torch.tensor([[9, -9, 16, 7, -8, 0, 1, -1]], dtype=torch.int32, device=device)
    wrapped = torch.tensor([[-7, 7, 0, 7, -8, 0, 1, -1]], dtype=torch.int32, device=device)
    a = torch_npu.npu_convert_weight_to_int4pack(w)
    assert torch.equal(a.cpu(), torch_npu.npu_convert_weight_to_int4pack(wrapped).cpu())
    assert a.cpu().tolist() == loop_pack(w.cpu())


def test_inner_k_tiles_is_reserved_and_unused():
    gen = torch.Generator().manual_seed(3)
    w = int4((16, 64), gen).npu()
    base = torch_npu.npu_convert_weight_to_int4pack(w)
    for tiles in (2, 4, 8):
        assert torch.equal(torch_npu.npu_convert_weight_to_int4pack(w, inner_k_tiles=tiles).cpu(), base.cpu())


def test_fractal_nz_input_gives_fractal_nz_result():
    gen = torch.Generator().manual_seed(4)
    w = int4((32, 64), gen)
    nd = torch_npu.npu_convert_weight_to_int4pack(w.npu())
    assert torch_npu.get_npu_format(nd) == 2
    nz_in = torch_npu.npu_format_cast(w.npu(), 29)
    nz = torch_npu.npu_convert_weight_to_int4pack(nz_in)
    assert torch_npu.get_npu_format(nz) == 29
    assert nz.shape == (32, 8)
    assert torch.equal(nz.cpu(), nd.cpu())


@pytest.mark.parametrize("bad, message", [
    (lambda: torch.zeros(16, 8, dtype=torch.int32).t(), "weight should be contiguous"),
    (lambda: torch.zeros(2, 4, 8, dtype=torch.int32), "weight shape only support dim num 2, but it is 3"),
    (lambda: torch.zeros(16, dtype=torch.int32), "weight shape only support dim num 2, but it is 1"),
    (lambda: torch.zeros(4, 8, dtype=torch.float32), "weight dtype only support int32"),
    (lambda: torch.zeros(4, 8, dtype=torch.int8), "weight dtype only support int32"),
    (lambda: torch.zeros(0, 8, dtype=torch.int32), "weight dim should be greater than 0"),
    (lambda: torch.zeros(4, 12, dtype=torch.int32), "weight last dim should be the multiple of 8, but it is 12"),
])
@pytest.mark.parametrize("device", DEVICES)
def test_pack_errors(bad, message, device):
    w = bad()
    w = w.to(device) if w.is_contiguous() else w.t().to(device).t()
    with pytest.raises(RuntimeError, match=message):
        torch_npu.npu_convert_weight_to_int4pack(w)


def test_pack_fake_and_meta_shapes():
    with FakeTensorMode():
        out = torch_npu.npu_convert_weight_to_int4pack(torch.empty(24, 40, dtype=torch.int32))
        assert out.shape == (24, 5) and out.dtype == torch.int32
    out = torch_npu.npu_convert_weight_to_int4pack(torch.empty(8, 16, dtype=torch.int32, device="meta"))
    assert out.shape == (8, 2) and out.device.type == "meta"


# ------------------------------------------------------------ npu_weight_quant_batchmatmul, int4


def antiquant_reference(x, w, scale, offset, bias, group):
    """float64 ``x @ ((w + offset) * scale) + bias``; per-group rows i use scale row i // group."""
    wf = w.double()
    k = wf.shape[0]

    def rows(t):
        t = t.double()
        if group:
            return t[torch.arange(k) // group]
        return t.reshape(1, -1) if t.numel() > 1 else t.reshape(1, 1)

    if offset is not None:
        wf = wf + rows(offset)
    wf = wf * rows(scale)
    y = x.double() @ wf
    return y if bias is None else y + bias.double()


def check_close(y, ref, rtol):
    assert y.shape == ref.shape
    err = (y.cpu().double() - ref).abs()
    limit = rtol * ref.abs() + rtol * ref.abs().max() * 0.05 + 1e-3
    assert bool((err <= limit).all()), float((err - limit).max())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype, rtol", OUT)
@pytest.mark.parametrize("trans_weight", [False, True])
def test_wqbmm_int4_per_channel_matches_formula(device, dtype, rtol, trans_weight):
    """The op-plugin golden's scenario: (m, k, n) = (128, 64, 32), per-channel scale/offset."""
    gen = torch.Generator().manual_seed(11 + trans_weight)
    m, k, n = 128, 64, 32
    x = torch.randn(m, k, generator=gen).to(dtype)
    w = int4((k, n), gen)                                   # the int4 values, (k, n)
    scale = torch.randn(1, n, generator=gen).to(dtype)
    offset = torch.randn(1, n, generator=gen).to(dtype)
    if trans_weight:
        packed = torch_npu.npu_convert_weight_to_int4pack(w.t().contiguous().to(device)).t()   # (k/8, n)
        assert packed.shape == (k // 8, n)
    else:
        packed = torch_npu.npu_convert_weight_to_int4pack(w.to(device))                         # (k, n/8)
    y = torch_npu.npu_weight_quant_batchmatmul(x.to(device), packed, scale.to(device), offset.to(device))
    assert y.dtype == dtype and y.device.type == device
    check_close(y, antiquant_reference(x, w, scale, offset, None, 0), rtol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype, rtol", OUT)
def test_wqbmm_int4_per_group_with_bias(device, dtype, rtol):
    gen = torch.Generator().manual_seed(21)
    m, k, n, g = 7, 96, 40, 32
    x = torch.randn(m, k, generator=gen).to(dtype)
    w = int4((k, n), gen)
    scale = (torch.rand(k // g, n, generator=gen) + 0.5).to(dtype)
    offset = torch.randn(k // g, n, generator=gen).to(dtype)
    bias = torch.randn(n, generator=gen).to(torch.float32 if dtype == torch.bfloat16 else dtype)
    packed = torch_npu.npu_convert_weight_to_int4pack(w.to(device))
    y = torch_npu.npu_weight_quant_batchmatmul(x.to(device), packed, scale.to(device), offset.to(device),
                                               bias=bias.to(device), antiquant_group_size=g)
    check_close(y, antiquant_reference(x, w, scale, offset, bias, g), rtol)


@pytest.mark.parametrize("device", DEVICES)
def test_wqbmm_int4_per_tensor_no_offset_batched_x(device):
    gen = torch.Generator().manual_seed(31)
    x = torch.randn(3, 5, 16, generator=gen).half()
    w = int4((16, 24), gen)
    scale = torch.tensor([0.25], dtype=torch.float16)
    packed = torch_npu.npu_convert_weight_to_int4pack(w.to(device))
    y = torch_npu.npu_weight_quant_batchmatmul(x.to(device), packed, scale.to(device))
    check_close(y, antiquant_reference(x, w, scale, None, None, 0), 2e-3)


def test_wqbmm_int4_column_slice_is_not_a_transposed_weight():
    """A non-contiguous column slice of a packed (k, n/8) tensor is still packed along n."""
    gen = torch.Generator().manual_seed(41)
    k, n = 32, 64
    w = int4((k, n), gen)
    packed = torch_npu.npu_convert_weight_to_int4pack(w.npu())[:, 2:6]     # columns 16..47
    assert not packed.is_contiguous()
    x = torch.randn(4, k, generator=gen).half()
    scale = torch.ones(32, dtype=torch.float16)
    y = torch_npu.npu_weight_quant_batchmatmul(x.npu(), packed, scale.npu())
    check_close(y, antiquant_reference(x, w[:, 16:48], scale, None, None, 0), 2e-3)


def test_wqbmm_int4_matches_int8_path_on_same_values():
    gen = torch.Generator().manual_seed(51)
    w = int4((64, 48), gen)
    x = torch.randn(6, 64, generator=gen).half().npu()
    scale = torch.randn(48, generator=gen).half().npu()
    offset = torch.randn(48, generator=gen).half().npu()
    packed = torch_npu.npu_convert_weight_to_int4pack(w.npu())
    y4 = torch_npu.npu_weight_quant_batchmatmul(x, packed, scale, offset)
    y8 = torch_npu.npu_weight_quant_batchmatmul(x, w.to(torch.int8).npu(), scale, offset)
    assert torch.equal(y4.cpu(), y8.cpu())


def test_wqbmm_int4_fake_shapes():
    with FakeTensorMode():
        x = torch.empty(4, 64, dtype=torch.float16)
        s = torch.empty(1, 48, dtype=torch.float16)
        y = torch_npu.npu_weight_quant_batchmatmul(x, torch.empty(64, 6, dtype=torch.int32), s)
        assert y.shape == (4, 48) and y.dtype == torch.float16
        yt = torch_npu.npu_weight_quant_batchmatmul(x, torch.empty(48, 8, dtype=torch.int32).t(), s)
        assert yt.shape == (4, 48)
    y = torch_npu.npu_weight_quant_batchmatmul(torch.empty(4, 64, dtype=torch.bfloat16, device="meta"),
                                               torch.empty(64, 6, dtype=torch.int32, device="meta"),
                                               torch.empty(48, dtype=torch.bfloat16, device="meta"))
    assert y.shape == (4, 48) and y.dtype == torch.bfloat16


def test_wqbmm_int4_errors():
    x = torch.randn(4, 64).half()
    s = torch.ones(48, dtype=torch.float16)
    with pytest.raises(RuntimeError, match="x last dim must be k=32"):      # (32, 6): k = 32
        torch_npu.npu_weight_quant_batchmatmul(x, torch.zeros(32, 6, dtype=torch.int32), s)
    with pytest.raises(RuntimeError, match="weight must be 2-d"):
        torch_npu.npu_weight_quant_batchmatmul(x, torch.zeros(2, 64, 6, dtype=torch.int32), s)
    with pytest.raises(RuntimeError, match=r"antiquant_scale must have 1 element or shape \(48,\)"):
        torch_npu.npu_weight_quant_batchmatmul(x, torch.zeros(64, 6, dtype=torch.int32),
                                               torch.ones(6, dtype=torch.float16))
    with pytest.raises(NotImplementedError, match="weight dtype torch.int16"):
        torch_npu.npu_weight_quant_batchmatmul(x, torch.zeros(64, 48, dtype=torch.int16), s)
