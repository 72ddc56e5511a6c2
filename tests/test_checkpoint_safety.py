"""Crash-safe checkpoints: torch_npu.utils.save_async, corrupt-file errors, weights_only safety."""
import inspect
import io
import os
import pickle
import random
import signal
import subprocess
import sys
import textwrap
import time
import zipfile

import pytest
import torch

import torch_npu
from torch_npu.utils import save_async
from torch_npu.utils._save_async import _wait_for_pending_saves

from _subproc import REPO, make_env

SCHEMA = os.path.join(os.path.dirname(REPO), "shared", "reference", "torch_npu-2.13.0", "public_api_schema.tsv")


def _bytes(t):
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)


def test_signature_is_the_real_one():
    params = inspect.signature(save_async).parameters
    assert list(params) == ["obj", "f", "pickle_module", "pickle_protocol", "_use_new_zipfile_serialization",
                            "_disable_byteorder_record", "model"]
    assert params["pickle_module"].default is pickle
    assert params["pickle_protocol"].default == 2
    assert params["_use_new_zipfile_serialization"].default is True
    assert params["_disable_byteorder_record"].default is False
    assert params["model"].default is None
    assert torch_npu.utils.save_async is torch_npu.utils.serialization.save_async
    assert torch_npu.utils.serialization.__all__ == ["load", "save_async"]
    if os.path.exists(SCHEMA):
        with open(SCHEMA, encoding="utf-8") as f:
            rows = dict(line.rstrip("\n").split("\t", 1) for line in f if "\t" in line)
        real = rows["torch_npu.utils.save_async"]
        for name in params:
            assert name in real
        assert "pickle_protocol: int = 2" in real and "model: torch.nn.modules.module.Module = None" in real


def test_save_async_roundtrip_keeps_npu_locations_and_snapshot(tmp_path):
    a = torch.randn(64, 32).npu()
    b = torch.arange(10).to("npu:1")
    model = torch.nn.Linear(4, 3).npu()
    path = tmp_path / "ckpt.pt"
    expected_a = a.cpu().clone()
    save_async({"a": a, "b": b[3:], "step": 7, "model": model.state_dict()}, path, model=model)
    a.add_(1.0)  # after the call: must not change what is saved
    _wait_for_pending_saves()
    out = torch.load(path, weights_only=True)
    assert out["step"] == 7
    assert out["a"].device == torch.device("npu:0") and out["b"].device == torch.device("npu:1")
    assert torch.equal(_bytes(out["a"]), _bytes(expected_a))
    assert torch.equal(out["b"].cpu(), torch.arange(3, 10))
    for k, v in model.state_dict().items():
        assert torch.equal(_bytes(out["model"][k]), _bytes(v))


def test_save_async_to_file_object_and_order(tmp_path):
    buf = io.BytesIO()
    save_async(torch.ones(5).npu(), buf)
    _wait_for_pending_saves()
    buf.seek(0)
    assert torch.equal(torch.load(buf).cpu(), torch.ones(5))
    path = tmp_path / "same.pt"
    for step in range(20):  # many saves to one path: the last call wins
        save_async({"step": step, "t": torch.full((1000,), float(step)).npu()}, path)
    _wait_for_pending_saves()
    out = torch.load(path)
    assert out["step"] == 19 and bool((out["t"] == 19).all())
    assert [p.name for p in tmp_path.iterdir()] == ["same.pt"]  # no temporary files left


def test_save_async_argument_errors(tmp_path):
    with pytest.raises(RuntimeError, match="_use_new_zipfile_serialization=False"):
        save_async(torch.ones(2).npu(), tmp_path / "x.pt", _use_new_zipfile_serialization=False)
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        save_async(torch.ones(2).npu(), tmp_path / "x.pt", model="not a model")
    assert not (tmp_path / "x.pt").exists()


_KILL_CHILD = textwrap.dedent("""
    import os, stat, sys, time, torch, torch_npu
    from torch_npu.utils import save_async
    _real_fsync = os.fsync
    announce = sys.argv[2] == "announce"
    def _slow_disk_fsync(fd):           # a slow disk: most of each save is spent in the write
        if announce and stat.S_ISREG(os.fstat(fd).st_mode) and step >= 2:
            # The temporary file is written and not yet renamed: tell the parent and stay here until killed
            # (the parent reads its children one after another, so a later moment could be long past).
            print("in-write", flush=True)
            time.sleep(3600)
        time.sleep(0.03)
        _real_fsync(fd)
    os.fsync = _slow_disk_fsync
    from torch_npu.utils._save_async import _wait_for_pending_saves
    path = sys.argv[1]
    w = torch.zeros(4 * 1024 * 1024).npu()   # 16 MiB: the write is most of each loop
    step = 0
    while True:
        step += 1
        w.fill_(float(step))
        _wait_for_pending_saves()              # at most one write in flight
        save_async({"step": step, "w": w}, path)
        if step == 1:
            _wait_for_pending_saves()
            print("first", flush=True)
""")


def test_sigkill_mid_save_always_leaves_a_loadable_checkpoint(tmp_path):
    """Kill writers at random moments and inside writes; the file at the path always loads and is self-consistent.

    Half the children are killed at a random moment. The other half announce when a temporary file is
    written but not yet renamed and are killed there, so the test never depends on a random kill landing
    inside a write (on a fast disk few of them do)."""
    rng = random.Random(1234)
    children = []
    for i in range(6):
        path = tmp_path / f"run{i}" / "ckpt.pt"
        path.parent.mkdir()
        mode = "announce" if i % 2 else "random"
        proc = subprocess.Popen([sys.executable, "-c", _KILL_CHILD, str(path), mode], cwd=str(REPO), env=make_env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        children.append((proc, path, mode))
    killed_inside_a_write = 0
    for proc, path, mode in children:
        try:
            assert proc.stdout.readline().strip() == "first", proc.stderr.read()[-3000:]
            if mode == "random":
                time.sleep(rng.uniform(0.05, 0.6))
            else:
                assert proc.stdout.readline().strip() == "in-write", proc.stderr.read()[-3000:]
            os.kill(proc.pid, signal.SIGKILL)
        finally:
            proc.kill()
            proc.wait(timeout=60)
            proc.stdout.close()
            proc.stderr.close()
        assert proc.returncode == -signal.SIGKILL
        out = torch.load(path, weights_only=True)
        assert out["step"] >= 1
        assert out["w"].device == torch.device("npu:0")
        assert bool((out["w"] == float(out["step"])).all()), "checkpoint mixes two saves"
        leftovers = [p for p in path.parent.iterdir() if p.name.startswith(".ckpt.pt.tmp-")]
        if mode == "announce":
            # The kill landed inside a write: its temporary file is left behind, yet the target loaded.
            assert leftovers, "the announced write left no temporary file"
            killed_inside_a_write += 1
    assert killed_inside_a_write == 3


# ---- truncated and corrupt files ------------------------------------------------------------------

def _good_checkpoint(path):
    torch.save({"w": torch.randn(128, 64).npu(), "step": 3}, path)
    return path.read_bytes()


@pytest.mark.parametrize("keep", [0, 3, 200, 5000, -40])
def test_truncated_checkpoint_error_names_the_file(tmp_path, keep):
    data = _good_checkpoint(tmp_path / "good.pt")
    bad = tmp_path / "bad.pt"
    bad.write_bytes(data[:keep] if keep >= 0 else data[:len(data) + keep])
    with pytest.raises(RuntimeError) as info:
        torch.load(bad)
    msg = str(info.value)
    assert f"torch.load: the checkpoint file '{bad}' is truncated or corrupt" in msg
    assert {0: "the file is empty", 3: "the file is 3 bytes, shorter than any checkpoint"}.get(
        keep, "probably truncated") in msg
    assert info.value.__cause__ is not None  # PyTorch's own error is kept as the cause


def test_corrupt_pickle_record_error_names_record_and_file(tmp_path):
    data = bytearray(_good_checkpoint(tmp_path / "good.pt"))
    with zipfile.ZipFile(io.BytesIO(bytes(data))) as z:
        info = z.getinfo(next(n for n in z.namelist() if n.endswith("data.pkl")))
    start = info.header_offset + 30 + len(info.filename) + len(info.extra)
    data[start + 10:start + 30] = b"\x00" * 20
    bad = tmp_path / "bad.pt"
    bad.write_bytes(bytes(data))
    with pytest.raises(RuntimeError, match=r"checkpoint file '.*bad\.pt' is truncated or corrupt: record "
                                           r"'.*data\.pkl' fails its CRC-32 check"):
        torch.load(bad)
    # the same bytes through a file object name the object
    with pytest.raises(RuntimeError, match="checkpoint file '<BytesIO>' is truncated or corrupt"):
        torch.load(io.BytesIO(bytes(data)))


def test_not_a_checkpoint_error_names_the_file(tmp_path):
    bad = tmp_path / "notes.txt"
    bad.write_text("hello, not a checkpoint")
    with pytest.raises(RuntimeError, match=r"checkpoint file '.*notes\.txt' is truncated or corrupt: it does not "
                                           r"start like a PyTorch checkpoint \(first bytes b'hell'\)"):
        torch.load(bad)


def test_intact_files_keep_pytorchs_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        torch.load(tmp_path / "missing.pt")
    buf = io.BytesIO()
    torch.save(torch.ones(3).npu(), buf)
    buf.seek(0)
    with pytest.raises(RuntimeError) as info:
        torch.load(buf, map_location="npu:99")
    assert str(info.value) == (f"Attempting to deserialize object on NPU device 99 but torch.npu.device_count() is "
                               f"{torch.npu.device_count()}. Please use torch.load with map_location to map your "
                               f"storages to an existing device.")


# ---- weights_only security ----------------------------------------------------------------------

class _RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):  # unpickling this runs a shell command that creates ``marker``
        return (os.system, (f"touch '{self.marker}'",))


def test_torch_load_is_torch_npus_and_defaults_to_weights_only(tmp_path):
    assert torch.load is torch_npu.utils.serialization.load
    assert inspect.signature(torch.load).parameters["weights_only"].default is None
    path = tmp_path / "ckpt.pt"
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4)).to("npu:1")
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(5, 3).to("npu:1")).sum().backward()
    opt.step()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "rng": torch.npu.get_rng_state_all()}, path)
    out = torch.load(path, weights_only=True)
    assert out["model"]["0.weight"].device == torch.device("npu:1")
    assert out["opt"]["state"][0]["exp_avg"].device == torch.device("npu:1")
    assert len(out["rng"]) == torch.npu.device_count()


def test_pickled_code_is_refused(tmp_path, monkeypatch):
    path = tmp_path / "evil.pt"
    marker = tmp_path / "code-ran"
    torch.save({"w": torch.ones(2).npu(), "payload": _RunsCode(marker)}, path)
    for kwargs in ({}, {"weights_only": True}):
        with pytest.raises(pickle.UnpicklingError,
                           match="(?s)Weights only load failed.*unsupported GLOBAL posix.system"):
            torch.load(path, **kwargs)
    monkeypatch.setenv("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "1")
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        torch.load(path, weights_only=False)
    assert not marker.exists()
    monkeypatch.delenv("TORCH_FORCE_WEIGHTS_ONLY_LOAD")
    # control: the payload is real code, run when the caller explicitly trusts the file
    torch.load(path, weights_only=False)
    assert marker.exists()


@pytest.mark.parametrize("seed", range(8))
def test_zip_signature_followed_by_random_bytes_is_corrupt_not_truncated(tmp_path, seed):
    bad = tmp_path / "random.pt"
    bad.write_bytes(b"PK\x03\x04" + random.Random(seed).randbytes(3000))
    with pytest.raises(RuntimeError) as info:
        torch.load(bad)
    msg = str(info.value)
    assert f"checkpoint file '{bad}' is truncated or corrupt: it is not a zip archive written by torch.save: " \
           "its first record" in msg and "the file is 3004 bytes, corrupt" in msg, msg
    assert "probably truncated" not in msg
