"""Random number generation on the emulated npu (torch.npu RNG API, spec: SURFACE.md section 3).

State of an npu generator: 16 uint8 bytes, ``[seed: uint64 little-endian | offset: int64]``;
an 8-byte (seed-only) state is accepted too.
"""
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_npu  # noqa: F401


@pytest.fixture(autouse=True)
def _restore_rng():
    """Each test starts on device 0 from known seeds and leaves no trace."""
    torch.npu.set_device(0)
    cpu_state = torch.get_rng_state()
    npu_states = torch.npu.get_rng_state_all()
    yield
    torch.npu.set_device(0)
    torch.set_rng_state(cpu_state)
    torch.npu.set_rng_state_all(npu_states)


def _seed_of(state):
    return int.from_bytes(bytes(state[:8].tolist()), "little", signed=False)


def _offset_of(state):
    return int.from_bytes(bytes(state[8:16].tolist()), "little", signed=True)


def _state_bytes(seed, offset=None):
    b = list(seed.to_bytes(8, "little"))
    if offset is not None:
        b += list(offset.to_bytes(8, "little", signed=True))
    return torch.tensor(b, dtype=torch.uint8)


RANDOM_OPS = {
    "randn": lambda d: torch.randn(64, 3, device=d),
    "randn_fp64": lambda d: torch.randn(50, dtype=torch.float64, device=d),
    "rand": lambda d: torch.rand(200, device=d),
    "rand_fp16": lambda d: torch.rand(200, dtype=torch.float16, device=d),
    "randint": lambda d: torch.randint(0, 1000, (100,), device=d),
    "randint_like": lambda d: torch.randint_like(torch.empty(100, device=d), 5, 10 ** 6),
    "randn_like": lambda d: torch.randn_like(torch.empty(7, 9, device=d)),
    "normal_": lambda d: torch.empty(100, device=d).normal_(2.0, 0.5),
    "normal_tensor": lambda d: torch.normal(torch.arange(50., device=d), torch.ones(50, device=d)),
    "uniform_": lambda d: torch.empty(100, device=d).uniform_(-3, 3),
    "exponential_": lambda d: torch.empty(100, device=d).exponential_(),
    "bernoulli": lambda d: torch.bernoulli(torch.full((300,), 0.5, device=d)),
    "bernoulli_p": lambda d: torch.empty(300, device=d).bernoulli_(0.3),
    "dropout_mask": lambda d: F.dropout(torch.ones(400, device=d), 0.5, training=True),
    "dropout_module": lambda d: nn.Dropout(0.3)(torch.ones(20, 20, device=d)),
    "native_dropout_mask": lambda d: torch.native_dropout(torch.ones(300, device=d), 0.5, True)[1],
    "randperm": lambda d: torch.randperm(100, device=d),
    "multinomial": lambda d: torch.multinomial(torch.ones(1000, device=d), 50),
    "multinomial_replacement": lambda d: torch.multinomial(torch.tensor([0.1, 0.2, 0.3, 0.4], device=d), 200,
                                                           replacement=True),
    "geometric_": lambda d: torch.empty(100, device=d).geometric_(0.2),
    "log_normal_": lambda d: torch.empty(100, device=d).log_normal_(),
    "random_": lambda d: torch.empty(100, dtype=torch.int64, device=d).random_(0, 10 ** 6),
    "poisson": lambda d: torch.poisson(torch.full((100,), 4.0, device=d)),
    "cauchy_": lambda d: torch.empty(100, device=d).cauchy_(),
    "bernoulli_tensor_p": lambda d: torch.empty(200, device=d).bernoulli_(torch.full((200,), 0.5, device=d)),
    "binomial": lambda d: torch.binomial(torch.full((100,), 10., device=d), torch.full((100,), 0.5, device=d)),
    "standard_gamma": lambda d: torch._standard_gamma(torch.full((50,), 2.0, device=d)),
    "rrelu": lambda d: F.rrelu(torch.full((100,), -1.0, device=d), training=True),
    "gumbel_softmax": lambda d: F.gumbel_softmax(torch.zeros(10, 5, device=d)),
    "alpha_dropout": lambda d: F.alpha_dropout(torch.ones(200, device=d), 0.5, True),
    "dropout2d": lambda d: F.dropout2d(torch.ones(4, 20, 3, 3, device=d), 0.5, True),
    "sdpa_dropout": lambda d: F.scaled_dot_product_attention(
        *(torch.arange(160., device=d).reshape(2, 2, 5, 8).sin(),) * 3, dropout_p=0.5),
    "kaiming_uniform_": lambda d: nn.init.kaiming_uniform_(torch.empty(8, 8, device=d)),
    "normal_strided_view": lambda d: torch.zeros(8, 8, device=d)[:, ::2].normal_(),
}


@pytest.mark.parametrize("name", sorted(RANDOM_OPS))
def test_manual_seed_reproduces_each_random_op(name):
    op = RANDOM_OPS[name]
    torch.npu.manual_seed(1234)
    torch.default_generator.manual_seed(1)  # the CPU generator's state must not matter
    a = op("npu")
    a2 = op("npu")
    torch.npu.manual_seed(1234)
    torch.default_generator.manual_seed(2)
    b = op("npu")
    b2 = op("npu")
    torch.npu.manual_seed(4321)
    c = op("npu")
    assert a.device == torch.device("npu:0")
    assert torch.equal(a.cpu(), b.cpu()) and torch.equal(a2.cpu(), b2.cpu())
    assert not torch.equal(a.cpu(), a2.cpu()), "two consecutive draws gave the same numbers"
    assert not torch.equal(a.cpu(), c.cpu()), "different seeds gave the same numbers"


def test_inplace_random_on_strided_view_writes_only_the_view():
    torch.npu.manual_seed(3)
    x = torch.zeros(6, 6, device="npu")
    r = x[:, ::2].normal_()
    assert r.data_ptr() == x.data_ptr()
    xc = x.cpu()
    assert bool((xc[:, 1::2] == 0).all()) and bool((xc[:, ::2] != 0).all())


def test_random_values_are_sane():
    torch.npu.manual_seed(0)
    r = torch.rand(10000, device="npu").cpu()
    assert bool(((r >= 0) & (r < 1)).all()) and abs(r.mean().item() - 0.5) < 0.02
    n = torch.randn(10000, device="npu").cpu()
    assert abs(n.mean().item()) < 0.05 and abs(n.std().item() - 1) < 0.05
    ri = torch.randint(3, 7, (1000,), device="npu").cpu()
    assert set(ri.unique().tolist()) == {3, 4, 5, 6}
    p = torch.randperm(1000, device="npu").cpu()
    assert torch.equal(p.sort()[0], torch.arange(1000))


def test_npu_generator_independent_of_cpu_generator():
    torch.npu.manual_seed(11)
    a = torch.randn(100, device="npu").cpu()
    # seeding / drawing from the CPU generator does not change npu draws
    torch.npu.manual_seed(11)
    torch.default_generator.manual_seed(999)
    torch.randn(50)
    torch.rand(7)
    b = torch.randn(100, device="npu").cpu()
    assert torch.equal(a, b)
    # and vice versa
    torch.default_generator.manual_seed(3)
    c = torch.randn(100)
    torch.default_generator.manual_seed(3)
    cpu_state = torch.get_rng_state()
    torch.npu.manual_seed(12345)
    torch.randn(10, device="npu")
    torch.npu.seed()
    torch.rand(10, device="npu")
    assert torch.equal(torch.get_rng_state(), cpu_state)
    d = torch.randn(100)
    assert torch.equal(c, d)


def test_npu_draws_do_not_change_cpu_state_and_cpu_draws_do_not_change_npu_state():
    torch.npu.manual_seed(5)
    npu_state = torch.npu.get_rng_state()
    torch.randn(1000)
    torch.randperm(100)
    assert torch.equal(torch.npu.get_rng_state(), npu_state)
    cpu_state = torch.get_rng_state()
    torch.randn(1000, device="npu")
    torch.randperm(100, device="npu")
    assert torch.equal(torch.get_rng_state(), cpu_state)
    assert not torch.equal(torch.npu.get_rng_state(), npu_state)


def test_torch_manual_seed_also_seeds_npu():
    # torch.manual_seed seeds every accelerator (torch.random._seed_custom_device), as for CUDA
    torch.manual_seed(77)
    assert torch.npu.initial_seed() == 77
    a = torch.randn(20, device="npu").cpu()
    torch.npu.manual_seed(77)
    assert torch.equal(torch.randn(20, device="npu").cpu(), a)


def test_get_rng_state_layout_and_offset_growth():
    seed = 0xFEDCBA9876543210
    torch.npu.manual_seed(seed)
    s0 = torch.npu.get_rng_state()
    assert s0.dtype == torch.uint8 and s0.shape == (16,) and s0.device.type == "cpu"
    assert bytes(s0[:8].tolist()) == seed.to_bytes(8, "little")
    assert _seed_of(s0) == seed
    assert _offset_of(s0) == 0
    assert torch.npu.initial_seed() == seed
    torch.randn(10, device="npu")
    s1 = torch.npu.get_rng_state()
    assert _seed_of(s1) == seed
    assert _offset_of(s1) > 0
    torch.rand(1000, device="npu")
    s2 = torch.npu.get_rng_state()
    assert _offset_of(s2) > _offset_of(s1)
    F.dropout(torch.ones(100, device="npu"), 0.5)
    assert _offset_of(torch.npu.get_rng_state()) > _offset_of(s2)
    # non-random ops leave the state alone
    s3 = torch.npu.get_rng_state()
    (torch.ones(10, device="npu") * 2).sum()
    assert torch.equal(torch.npu.get_rng_state(), s3)
    # the state is a copy: mutating it changes nothing
    s3.zero_()
    assert _seed_of(torch.npu.get_rng_state()) == seed


def test_set_rng_state_roundtrip():
    torch.npu.manual_seed(99)
    torch.randn(33, device="npu")
    state = torch.npu.get_rng_state()
    a = [torch.randn(17, device="npu").cpu(), torch.randint(0, 100, (9,), device="npu").cpu(),
         F.dropout(torch.ones(64, device="npu"), 0.5).cpu()]
    torch.npu.set_rng_state(state)
    assert torch.equal(torch.npu.get_rng_state(), state)
    b = [torch.randn(17, device="npu").cpu(), torch.randint(0, 100, (9,), device="npu").cpu(),
         F.dropout(torch.ones(64, device="npu"), 0.5).cpu()]
    for x, y in zip(a, b):
        assert torch.equal(x, y)
    # a hand-built 16-byte state with an explicit offset equals that point of the stream
    torch.npu.manual_seed(7)
    torch.randn(40, device="npu")
    off = _offset_of(torch.npu.get_rng_state())
    expected = torch.randn(10, device="npu").cpu()
    torch.npu.set_rng_state(_state_bytes(7, off))
    assert torch.equal(torch.randn(10, device="npu").cpu(), expected)


def test_set_rng_state_accepts_8_byte_state():
    torch.npu.manual_seed(2024)
    expected = torch.randn(25, device="npu").cpu()
    torch.npu.manual_seed(1)
    torch.randn(5, device="npu")
    torch.npu.set_rng_state(_state_bytes(2024))
    assert torch.npu.initial_seed() == 2024
    assert _offset_of(torch.npu.get_rng_state()) == 0
    assert torch.equal(torch.randn(25, device="npu").cpu(), expected)


def test_set_rng_state_rejects_bad_states():
    with pytest.raises(RuntimeError):
        torch.npu.set_rng_state(torch.zeros(5, dtype=torch.uint8))
        torch.npu.get_rng_state()
    with pytest.raises((RuntimeError, TypeError)):
        torch.npu.set_rng_state(torch.zeros(16, dtype=torch.float32))
        torch.npu.get_rng_state()


def test_rng_state_per_device_arguments():
    torch.npu.manual_seed_all(3)
    torch.randn(8, device="npu:1")
    s_str = torch.npu.get_rng_state("npu:1")
    s_int = torch.npu.get_rng_state(1)
    s_dev = torch.npu.get_rng_state(torch.device("npu", 1))
    assert torch.equal(s_str, s_int) and torch.equal(s_str, s_dev)
    assert _offset_of(s_str) > 0
    assert _offset_of(torch.npu.get_rng_state(0)) == 0
    a = torch.randn(6, device="npu:1").cpu()
    torch.npu.set_rng_state(s_str, "npu:1")
    assert torch.equal(torch.randn(6, device="npu:1").cpu(), a)
    torch.npu.set_rng_state(s_str, 1)
    assert torch.equal(torch.randn(6, device="npu:1").cpu(), a)


def test_get_set_rng_state_all():
    n = torch.npu.device_count()
    torch.npu.manual_seed_all(8)
    torch.randn(4, device="npu:0")
    torch.randn(12, device="npu:1")
    states = torch.npu.get_rng_state_all()
    assert isinstance(states, list) and len(states) == n
    assert all(s.dtype == torch.uint8 and s.numel() == 16 for s in states)
    assert _offset_of(states[0]) != _offset_of(states[1])
    a0, a1 = torch.randn(5, device="npu:0").cpu(), torch.randn(5, device="npu:1").cpu()
    torch.npu.set_rng_state_all(states)
    assert torch.equal(torch.randn(5, device="npu:0").cpu(), a0)
    assert torch.equal(torch.randn(5, device="npu:1").cpu(), a1)
    for got, exp in zip(torch.npu.get_rng_state_all(), states):
        assert _seed_of(got) == _seed_of(exp)


def test_manual_seed_all_and_manual_seed_current_device_only():
    torch.npu.manual_seed_all(21)
    gens = torch.npu.default_generators
    assert len(gens) == torch.npu.device_count()
    assert all(g.initial_seed() == 21 for g in gens)
    a0 = torch.randn(10, device="npu:0").cpu()
    a1 = torch.randn(10, device="npu:1").cpu()
    assert torch.equal(a0, a1)  # same (seed, offset) on each device -> same numbers, as on CUDA
    # manual_seed seeds only the current device
    with torch.npu.device(1):
        torch.npu.manual_seed(500)
    assert gens[1].initial_seed() == 500
    assert gens[0].initial_seed() == 21
    assert all(g.initial_seed() == 21 for i, g in enumerate(gens) if i != 1)


def test_seed_and_seed_all_and_initial_seed():
    torch.npu.manual_seed(42)
    assert torch.npu.initial_seed() == 42
    torch.randn(3, device="npu")
    assert torch.npu.initial_seed() == 42
    torch.npu.seed()
    s1 = torch.npu.initial_seed()
    assert s1 != 42
    assert _seed_of(torch.npu.get_rng_state()) == s1
    assert _offset_of(torch.npu.get_rng_state()) == 0
    torch.npu.seed()
    assert torch.npu.initial_seed() != s1
    torch.npu.manual_seed_all(42)
    torch.npu.seed_all()
    seeds = {g.initial_seed() for g in torch.npu.default_generators}
    assert len(seeds) == 1 and seeds != {42}
    torch.npu.seed_all()
    assert {g.initial_seed() for g in torch.npu.default_generators} != seeds


def test_default_generators_are_independent_per_device():
    gens = torch.npu.default_generators
    assert gens[1].device == torch.device("npu:1") and gens[0].device == torch.device("npu:0")
    torch.npu.manual_seed_all(5)
    s1 = gens[1].get_state()
    torch.randn(100, device="npu:0")
    torch.rand(10, device="npu")
    assert torch.equal(gens[1].get_state(), s1), "drawing on npu:0 changed npu:1's generator"
    gens[1].manual_seed(77)
    a = torch.randn(30, device="npu:1").cpu()
    s0 = gens[0].get_state()
    gens[1].manual_seed(77)
    b = torch.randn(30, device="npu:1").cpu()
    assert torch.equal(a, b)
    assert torch.equal(gens[0].get_state(), s0), "drawing on npu:1 changed npu:0's generator"
    # draws on a device use that device's default generator
    gens[1].manual_seed(77)
    with torch.npu.device(1):
        c = torch.randn(30, device="npu").cpu()
    assert torch.equal(a, c)
    gens[0].manual_seed(123)
    assert not torch.equal(torch.randn(30, device="npu:0").cpu(), a)


def test_explicit_generator_on_npu1():
    g = torch.Generator("npu:1")
    assert g.device == torch.device("npu:1")
    assert torch.Generator(device="npu:3").device == torch.device("npu:3")
    assert g.initial_seed() == 67280421310721  # c10::default_rng_seed_val, as for CPU/CUDA generators
    g.manual_seed(9)
    assert g.initial_seed() == 9
    default_state = torch.npu.get_rng_state(1)
    a = torch.randn(50, device="npu:1", generator=g)
    a_int = torch.randint(0, 100, (20,), device="npu:1", generator=g)
    a_perm = torch.randperm(30, device="npu:1", generator=g)
    a_norm = torch.empty(20, device="npu:1").normal_(generator=g)
    assert a.device == torch.device("npu:1") and a_perm.device == torch.device("npu:1")
    assert torch.equal(torch.npu.get_rng_state(1), default_state), "explicit generator advanced the default one"
    g.manual_seed(9)
    assert torch.equal(torch.randn(50, device="npu:1", generator=g).cpu(), a.cpu())
    assert torch.equal(torch.randint(0, 100, (20,), device="npu:1", generator=g).cpu(), a_int.cpu())
    assert torch.equal(torch.randperm(30, device="npu:1", generator=g).cpu(), a_perm.cpu())
    assert torch.equal(torch.empty(20, device="npu:1").normal_(generator=g).cpu(), a_norm.cpu())
    g.manual_seed(10)
    assert not torch.equal(torch.randn(50, device="npu:1", generator=g).cpu(), a.cpu())
    # an explicit generator seeded like the default one draws the same numbers
    torch.npu.default_generators[1].manual_seed(9)
    assert torch.equal(torch.randn(50, device="npu:1").cpu(), a.cpu())


def test_cpu_generator_rejected_for_npu_op():
    # as on CUDA (and torch_npu: check_generator<NPUGeneratorImpl>), a CPU generator cannot drive an npu op
    with pytest.raises(RuntimeError, match="generator"):
        torch.randn(3, device="npu", generator=torch.Generator())


def test_generator_get_state_set_state():
    g = torch.Generator("npu:1")
    g.manual_seed(31)
    torch.rand(10, device="npu:1", generator=g)
    st = g.get_state()
    assert st.dtype == torch.uint8 and st.numel() == 16
    assert _seed_of(st) == 31 and _offset_of(st) > 0
    a = torch.rand(40, device="npu:1", generator=g).cpu()
    assert _offset_of(g.get_state()) > _offset_of(st)
    g.set_state(st)
    assert torch.equal(torch.rand(40, device="npu:1", generator=g).cpu(), a)
    # transplanting the state into another generator
    g2 = torch.Generator("npu:1")
    g2.set_state(st)
    assert g2.initial_seed() == 31
    assert torch.equal(torch.rand(40, device="npu:1", generator=g2).cpu(), a)
    # default generator too
    dg = torch.npu.default_generators[0]
    dg.manual_seed(4)
    st0 = dg.get_state()
    b = torch.randn(12, device="npu").cpu()
    dg.set_state(st0)
    assert torch.equal(torch.randn(12, device="npu").cpu(), b)
    # graphsafe / clone_state round trip where available
    g3 = g.clone_state() if hasattr(g, "clone_state") else None
    if g3 is not None:
        assert torch.equal(g3.get_state(), g.get_state())


@pytest.mark.parametrize("devices", [[0], None])
def test_fork_rng_restores_npu_state(devices):
    torch.npu.manual_seed(55)
    torch.randn(3, device="npu")
    before = torch.npu.get_rng_state()
    expected_next = torch.randn(20, device="npu").cpu()
    torch.npu.set_rng_state(before)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fork_rng warns about multiple devices when devices is None
        with torch.random.fork_rng(devices=devices, device_type="npu"):
            torch.randn(100, device="npu")
            torch.npu.manual_seed(1)
            inner = torch.randn(20, device="npu").cpu()
            assert not torch.equal(torch.npu.get_rng_state(), before)
    assert torch.equal(torch.npu.get_rng_state(), before)
    got = torch.randn(20, device="npu").cpu()
    assert torch.equal(got, expected_next)
    assert not torch.equal(got, inner)


def test_fork_rng_also_restores_cpu_state():
    cpu_before = torch.get_rng_state()
    npu_before = torch.npu.get_rng_state()
    with torch.random.fork_rng(devices=[0], device_type="npu"):
        torch.manual_seed(0)
        torch.randn(5)
        torch.randn(5, device="npu")
    assert torch.equal(torch.get_rng_state(), cpu_before)
    assert torch.equal(torch.npu.get_rng_state(), npu_before)
