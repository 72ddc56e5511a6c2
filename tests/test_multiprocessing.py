"""torch.multiprocessing with npu tensors behaves as with CUDA tensors: they
travel as spawn/Process arguments and through queues, the receiver uses the
sender's device memory (writes are seen both ways), is_shared() tells the
truth, and hogwild training on a shared npu model updates the parent's model."""
import copy
import pickle
from multiprocessing.reduction import ForkingPickler

import pytest
import torch
import torch.multiprocessing as mp
import torch.nn as nn

import torch_npu  # noqa: F401
from _subproc import run_json

SPAWN = mp.get_context("spawn")
TIMEOUT = 240


# ------------------------------------------------------------------ in one process

def test_fresh_tensor_is_not_shared_and_share_memory_makes_it_shared():
    x = torch.arange(12, dtype=torch.float32, device="npu").reshape(3, 4)
    view = x[1:]
    assert not x.is_shared() and not x.untyped_storage().is_shared()
    assert x.share_memory_() is x
    assert x.is_shared() and view.is_shared() and x.untyped_storage().is_shared()
    assert x.device == torch.device("npu", 0) and x.untyped_storage().device.type == "npu"
    assert torch.equal(x.cpu(), torch.arange(12, dtype=torch.float32).reshape(3, 4))
    view.add_(100)  # views still share the (moved) storage
    assert x[1, 0].item() == 104.0
    x.share_memory_()  # no-op the second time
    assert x.is_shared()
    with pytest.raises(RuntimeError, match="not resizable"):
        x.untyped_storage().resize_(1024)
    assert not torch.empty(3, device="npu").is_shared()


def test_shared_memory_is_counted_by_the_device_allocator():
    torch.npu.synchronize()
    torch.npu.empty_cache()
    base_alloc, base_reserved = torch.npu.memory_allocated(), torch.npu.memory_reserved()
    n = 3 << 20
    x = torch.ones(n, dtype=torch.uint8, device="npu")
    x.share_memory_()  # the pool block is freed, the shared segment counted exactly
    assert torch.npu.memory_allocated() == base_alloc + n
    assert torch.npu.memory_reserved() >= base_reserved + n
    assert torch.npu.memory_stats()["segment.all.current"] >= 1
    assert x.sum().item() == n
    del x
    assert torch.npu.memory_allocated() == base_alloc


def test_pickling_rules():
    y = torch.ones(2, device="npu", requires_grad=True) * 2
    with pytest.raises(RuntimeError, match="Cowardly refusing to serialize non-leaf tensor"):
        ForkingPickler.dumps(y)
    with pytest.raises(RuntimeError, match="Cannot pickle NPU storage"):
        ForkingPickler.dumps(torch.ones(2, device="npu").untyped_storage())
    # CPU tensors keep torch's own reduction
    cpu = torch.ones(3)
    back = pickle.loads(ForkingPickler.dumps(cpu))
    assert torch.equal(back, cpu) and back.is_shared()


def test_round_trip_in_one_process_returns_the_same_memory():
    x = torch.arange(6.0, device="npu")
    back = pickle.loads(ForkingPickler.dumps(x))
    assert back.device == x.device and torch.equal(back.cpu(), x.cpu())
    back[0] = 42.0
    assert x[0].item() == 42.0
    assert back.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()


# ------------------------------------------------------------------ worker functions (spawned children import them)

def _add_rank(rank, shared, lock, errors):
    try:
        assert shared.is_npu and shared.is_shared() and shared.device == torch.device("npu", 0)
        with lock:
            shared.add_(float(rank + 1))
    except BaseException as e:  # reported to the parent, which asserts
        errors.put(repr(e))
        raise


def _consumer(inbox, outbox):
    x, view, p, t = inbox.get()
    ok = (x.is_npu and x.is_shared() and torch.equal(x.cpu(), torch.arange(12.0).reshape(3, 4))
          and isinstance(p, nn.Parameter) and p.requires_grad and t.stride() == (1, 2)
          and view.untyped_storage().data_ptr() == x.untyped_storage().data_ptr())
    view.fill_(-1.0)  # row 1 of x: the producer sees it
    outbox.put((ok, torch.full((2,), 7.0, device="npu")))
    inbox.get()  # keep our tensors alive until the parent has read the reply


class TinyNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def _train(model, seed, device, steps=5):
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        data = torch.randn(16, 8, generator=g).to(device)
        target = torch.randint(0, 3, (16,), generator=g).to(device)
        opt.zero_grad()
        nn.functional.cross_entropy(model(data), target).backward()
        opt.step()


def _hogwild_worker(rank, model):
    assert all(p.is_shared() and p.is_npu for p in model.parameters())
    _train(model, seed=100 + rank, device="npu")


# ------------------------------------------------------------------ across processes (spawn)

def test_spawn_arguments_share_memory_and_parent_sees_the_exact_sum():
    shared = torch.zeros(4, device="npu")
    assert not shared.is_shared()
    errors = SPAWN.SimpleQueue()
    mp.spawn(_add_rank, args=(shared, SPAWN.Lock(), errors), nprocs=2, join=True)
    assert errors.empty()
    assert shared.is_shared()  # sending shared it, as share_memory_ does
    assert torch.equal(shared.cpu(), torch.full((4,), 3.0))  # 1 + 2, written by the children


def test_queue_both_ways_with_views_parameters_and_strides():
    x = torch.arange(12.0, device="npu").reshape(3, 4)
    p = nn.Parameter(torch.ones(2, device="npu"))
    t = torch.arange(6.0, device="npu").reshape(3, 2).t()
    inbox, outbox = SPAWN.Queue(), SPAWN.Queue()
    proc = SPAWN.Process(target=_consumer, args=(inbox, outbox))
    proc.start()
    try:
        inbox.put((x, x[1], p, t))
        ok, reply = outbox.get(timeout=TIMEOUT)
        assert ok
        assert torch.equal(x[1].cpu(), torch.full((4,), -1.0))  # the consumer's write
        assert reply.is_npu and reply.is_shared() and torch.equal(reply.cpu(), torch.full((2,), 7.0))
        inbox.put(None)
    finally:
        proc.join(TIMEOUT)
    assert proc.exitcode == 0


def test_hogwild_training_updates_the_parents_model():
    torch.manual_seed(0)
    model = TinyNet().npu()
    reference = copy.deepcopy(model).cpu()
    model.share_memory()
    before = [p.detach().cpu().clone() for p in model.parameters()]
    # Concurrent hogwild, as in pytorch/examples mnist_hogwild.
    procs = [SPAWN.Process(target=_hogwild_worker, args=(rank, model)) for rank in range(2)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(TIMEOUT)
    assert [proc.exitcode for proc in procs] == [0, 0]
    assert all(not torch.equal(p.detach().cpu(), b) for p, b in zip(model.parameters(), before))

    # One worker after the other: the parent's model is exactly CPU training
    # on the same batches in the same order.
    torch.manual_seed(0)
    model = TinyNet().npu().share_memory()
    for rank in range(2):
        proc = SPAWN.Process(target=_hogwild_worker, args=(rank, model))
        proc.start()
        proc.join(TIMEOUT)
        assert proc.exitcode == 0
        _train(reference, seed=100 + rank, device="cpu")
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.equal(p.detach().cpu(), q.detach())


# ------------------------------------------------------------------ fork start method

FORK_SNIPPET = r'''
import torch, torch_npu
import torch.multiprocessing as mp

def producer(q, done):
    x = torch.arange(4.0, device="npu")
    q.put(x)
    done.wait()
    q.put(x.cpu().tolist())

if __name__ == "__main__":
    ctx = mp.get_context("fork")
    q, done = ctx.Queue(), ctx.Event()
    p = ctx.Process(target=producer, args=(q, done))
    p.start()  # the parent has not initialised the NPU: the child may
    x = q.get(timeout=120)
    shared = x.is_shared() and x.is_npu
    x.mul_(10)  # seen by the producer
    done.set()
    seen = q.get(timeout=120)
    p.join(120)

    def user(t, errors):
        try:
            t.add_(1)
            torch.ones(1, device="npu")
        except RuntimeError as e:
            errors.put(str(e))

    errors = ctx.Queue()
    p2 = ctx.Process(target=user, args=(x, errors))  # parent initialised now
    p2.start()
    p2.join(120)
    emit({"shared": shared, "seen": seen, "exit": p.exitcode, "fork_error": errors.get(timeout=60)})
'''


def test_fork_start_method():
    r = run_json(FORK_SNIPPET, timeout=TIMEOUT)
    assert r["shared"] and r["exit"] == 0
    assert r["seen"] == [0.0, 10.0, 20.0, 30.0]
    # As with CUDA: a child forked after the parent initialised the NPU cannot use it.
    assert "Cannot re-initialize NPU in forked subprocess" in r["fork_error"]
