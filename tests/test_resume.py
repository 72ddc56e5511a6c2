"""Exact resume in one process: stop at step k, resume in a fresh process, same losses and weights bit for bit.

The training run uses every source of randomness a real run has: dropout on
the npu generator, a shuffling DataLoader with its own generator, noise from
the CPU generator, Python's ``random`` and NumPy, AdamW, a cosine LR schedule,
and bf16 autocast or fp16 autocast with a GradScaler whose scale changes
during the run.  The recipe it follows is docs/resume.md.
"""
import pytest

from _subproc import run_many

TRAIN = r'''
import hashlib, itertools, random, sys
import numpy as np
import torch, torch.nn as nn
import torch_npu
from torch_npu.utils import save_async

AMP, TOTAL, STOP, CKPT, RESUME, OMIT = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], \
    sys.argv[5] == "resume", set(sys.argv[6].split(",")) - {""}
BATCHES_PER_EPOCH = 8

random.seed(0); np.random.seed(0); torch.manual_seed(0)
data = torch.randn(64, 16, generator=torch.Generator().manual_seed(1))
target = torch.randint(0, 4, (64,), generator=torch.Generator().manual_seed(2))
loader_gen = torch.Generator().manual_seed(3)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data, target), batch_size=8, shuffle=True,
                                     generator=loader_gen)
model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Dropout(0.3), nn.Linear(32, 4)).npu()
opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=TOTAL)
dtype = torch.bfloat16 if AMP == "bf16" else torch.float16
scaler = torch.npu.amp.GradScaler(init_scale=2.0 ** 14, growth_interval=2) if AMP == "fp16" else None

step, epoch, loader_state_at_epoch_start = 0, 0, loader_gen.get_state()
if RESUME:
    ck = torch.load(CKPT, weights_only=False)   # python/numpy RNG states are not tensors
    model.load_state_dict(ck["model"]); opt.load_state_dict(ck["opt"]); sched.load_state_dict(ck["sched"])
    if scaler is not None and "scaler" not in OMIT:
        scaler.load_state_dict(ck["scaler"])
    torch.set_rng_state(ck["cpu_rng"])
    if "npu_rng" not in OMIT:
        torch.npu.set_rng_state_all(ck["npu_rng"])
    random.setstate(ck["py_rng"]); np.random.set_state(ck["np_rng"])
    step, epoch = ck["step"], ck["epoch"]
    loader_state_at_epoch_start = ck["loader_gen"]
    if "sampler" not in OMIT:
        loader_gen.set_state(loader_state_at_epoch_start)

losses = []
while step < TOTAL:
    if step % BATCHES_PER_EPOCH == 0:
        loader_state_at_epoch_start = loader_gen.get_state()
    batches = iter(loader)   # draws this epoch's permutation from loader_gen
    for x, y in itertools.islice(batches, step % BATCHES_PER_EPOCH, None):
        x = x + 0.01 * torch.randn_like(x) + float(np.random.uniform(-0.01, 0.01))
        if random.random() < 0.5:
            x = -x
        x, y = x.npu(), y.npu()
        with torch.autocast("npu", dtype=dtype):
            loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        if scaler is not None:
            scaler.scale(loss).backward(); scaler.step(opt); scaler.update()
        else:
            loss.backward(); opt.step()
        sched.step()
        step += 1
        losses.append(float(loss).hex())
        if not RESUME and step == STOP:
            save_async({"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
                        "scaler": scaler.state_dict() if scaler is not None else None,
                        "cpu_rng": torch.get_rng_state(), "npu_rng": torch.npu.get_rng_state_all(),
                        "py_rng": random.getstate(), "np_rng": np.random.get_state(),
                        "loader_gen": loader_state_at_epoch_start, "step": step,
                        "epoch": step // BATCHES_PER_EPOCH}, CKPT)
        if step == TOTAL:
            break
    epoch += 1
weights = {k: hashlib.sha256(v.cpu().contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()
           for k, v in model.state_dict().items()}
emit({"losses": losses, "weights": weights, "scale": scaler.get_scale() if scaler is not None else None})
'''

TOTAL = 20  # 2.5 epochs of 8 batches


def _script(amp, stop, ckpt, mode, omit=""):
    argv = [amp, str(TOTAL), str(stop), str(ckpt), mode, omit]
    return f"import sys\nsys.argv = ['train'] + {argv!r}\n" + TRAIN


CASES = {"bf16": 13, "fp16": 11}  # amp mode -> step of the checkpoint (in the second epoch)
OMITS = {"bf16": ("", "npu_rng", "sampler"), "fp16": ("", "npu_rng", "sampler", "scaler")}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Both uninterrupted runs at once, then every resume at once (keeps the file's wall time low)."""
    tmp = tmp_path_factory.mktemp("resume")
    full = run_many({amp: (_script(amp, stop, tmp / f"{amp}.pt", "full"), None) for amp, stop in CASES.items()},
                    timeout=300)
    resumed = run_many({(amp, omit): (_script(amp, stop, tmp / f"{amp}.pt", "resume", omit), None)
                        for amp, stop in CASES.items() for omit in OMITS[amp]}, timeout=300)
    return full, resumed


def _unwrap(result):
    if isinstance(result, AssertionError):
        raise result
    return result


@pytest.mark.parametrize("amp", sorted(CASES))
def test_resume_in_fresh_process_is_bitwise_identical(runs, amp):
    stop = CASES[amp]
    full = _unwrap(runs[0][amp])
    exact = _unwrap(runs[1][(amp, "")])
    assert len(full["losses"]) == TOTAL and len(exact["losses"]) == TOTAL - stop
    assert exact["losses"] == full["losses"][stop:]
    assert exact["weights"] == full["weights"]
    assert exact["scale"] == full["scale"]
    if amp == "fp16":  # the scale really moved during the run, so the scaler state mattered
        assert full["scale"] != 2.0 ** 14


@pytest.mark.parametrize("amp,omit", [(amp, omit) for amp in sorted(CASES) for omit in OMITS[amp] if omit])
def test_each_piece_of_state_is_needed(runs, amp, omit):
    """Controls: resuming without one piece of state changes the continuation."""
    stop = CASES[amp]
    full = _unwrap(runs[0][amp])
    partial = _unwrap(runs[1][(amp, omit)])
    assert partial["losses"] != full["losses"][stop:]
