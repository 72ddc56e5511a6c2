"""torch.save / torch.load of npu tensors, modules and optimizer state."""
import copy
import io
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn as nn

import torch_npu  # noqa: F401

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _roundtrip(obj, **load_kw):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, **load_kw)


def _same(got, expected, device):
    assert isinstance(got, torch.Tensor)
    assert got.device == torch.device(device), (got.device, device)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    a = got.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
    b = expected.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
    assert torch.equal(a, b)


def _make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))


@pytest.mark.parametrize("device", ["npu:0", "npu:2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64,
                                   torch.int8, torch.bool, torch.complex64], ids=str)
def test_tensor_roundtrip_bytesio(dtype, device):
    c = (torch.randn(4, 5, dtype=torch.float64) * 10).to(dtype)
    x = c.to(device)
    y = _roundtrip(x)
    _same(y, c, device)
    assert y.data_ptr() != x.data_ptr()
    y2 = _roundtrip(x, weights_only=True)
    _same(y2, c, device)


def test_roundtrip_tmp_file_nested_containers(tmp_path):
    a = torch.randn(3, 3).npu()
    b = torch.arange(10).to("npu:1")
    obj = {"a": a, "list": [b, 5, "text"], "tuple": (a * 2, torch.tensor(1.5)), "nested": {"b": b[2:]}}
    path = tmp_path / "ckpt.pt"
    torch.save(obj, path)
    assert path.stat().st_size > 0
    out = torch.load(path)
    _same(out["a"], a, "npu:0")
    _same(out["list"][0], b, "npu:1")
    assert out["list"][1:] == [5, "text"]
    _same(out["tuple"][0], a * 2, "npu:0")
    _same(out["tuple"][1], torch.tensor(1.5), "cpu")
    _same(out["nested"]["b"], b[2:], "npu:1")
    # str path and weights_only
    out2 = torch.load(str(path), weights_only=True)
    _same(out2["a"], a, "npu:0")
    # legacy (non-zip) format too
    legacy = tmp_path / "legacy.pt"
    torch.save(obj, legacy, _use_new_zipfile_serialization=False)
    out3 = torch.load(legacy, weights_only=False)
    _same(out3["a"], a, "npu:0")
    _same(out3["nested"]["b"], b[2:], "npu:1")


@pytest.mark.filterwarnings("ignore:TypedStorage is deprecated")
def test_storage_roundtrip():
    x = torch.arange(12, dtype=torch.float32).to("npu:1")
    s = _roundtrip(x.untyped_storage())
    # torch.load hands storages back as (uint8) TypedStorage, exactly as for CPU storages
    ref = _roundtrip(torch.arange(12, dtype=torch.float32).untyped_storage())
    assert type(s) is type(ref)
    s = s.untyped() if hasattr(s, "untyped") else s
    assert s.device == torch.device("npu:1")
    assert s.nbytes() == 48
    t = torch.empty(0, device="npu:1").set_(s, 0, (12,), (1,))
    _same(t, x, "npu:1")


def test_module_state_dict_roundtrip(tmp_path):
    model = _make_model().npu()
    model.train()
    model(torch.randn(16, 6).npu())  # moves BN running stats away from their init
    sd = model.state_dict()
    path = tmp_path / "sd.pt"
    torch.save(sd, path)
    for kw in ({}, {"weights_only": True}):
        loaded = torch.load(path, **kw)
        assert list(loaded) == list(sd)
        for k in sd:
            _same(loaded[k], sd[k], str(sd[k].device))
        fresh = _make_model()
        torch.nn.init.constant_(fresh[0].weight, 0.0)
        fresh = fresh.npu()
        fresh.load_state_dict(loaded)
        model.eval()
        fresh.eval()
        x = torch.randn(5, 6).npu()
        _same(fresh(x), model(x), "npu:0")


def test_whole_module_roundtrip():
    model = _make_model().to("npu:1")
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert isinstance(loaded, nn.Sequential)
    for (n1, p1), (n2, p2) in zip(model.named_parameters(), loaded.named_parameters()):
        assert n1 == n2
        _same(p2, p1, "npu:1")
        assert p2.requires_grad
    for (n1, b1), (n2, b2) in zip(model.named_buffers(), loaded.named_buffers()):
        _same(b2, b1, "npu:1")
    model.eval()
    loaded.eval()
    x = torch.randn(4, 6).to("npu:1")
    _same(loaded(x), model(x), "npu:1")


def test_optimizer_state_roundtrip():
    model = _make_model().npu()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    data, target = torch.randn(8, 6).npu(), torch.randn(8, 3).npu()
    loss = nn.functional.mse_loss(model(data), target)
    loss.backward()
    opt.step()
    ckpt = {"model": model.state_dict(), "opt": opt.state_dict()}
    loaded = _roundtrip(ckpt)
    st = loaded["opt"]["state"]
    assert len(st) == len(list(model.parameters()))
    for pid, pstate in opt.state_dict()["state"].items():
        for key in ("exp_avg", "exp_avg_sq"):
            _same(st[pid][key], pstate[key], "npu:0")
        assert float(st[pid]["step"]) == float(pstate["step"]) == 1.0
    assert loaded["opt"]["param_groups"] == opt.state_dict()["param_groups"]
    # restore into a fresh model/optimizer: the next step matches the original exactly
    model2 = _make_model().npu()
    model2.load_state_dict(loaded["model"])
    opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-2, weight_decay=0.1)
    opt2.load_state_dict(loaded["opt"])
    for m, o in ((model, opt), (model2, opt2)):
        o.zero_grad()
        nn.functional.mse_loss(m(data), target).backward()
        o.step()
    for p1, p2 in zip(model.parameters(), model2.parameters()):
        _same(p2, p1, "npu:0")
    # weights_only load of optimizer state
    loaded_wo = _roundtrip(ckpt, weights_only=True)
    _same(loaded_wo["opt"]["state"][0]["exp_avg"], ckpt["opt"]["state"][0]["exp_avg"], "npu:0")


MAP_LOCATIONS = {
    "str_cpu": ("cpu", "cpu"),
    "str_npu2": ("npu:2", "npu:2"),
    "str_npu": ("npu", "npu:0"),
    "device_npu1": (torch.device("npu:1"), "npu:1"),
    "device_cpu": (torch.device("cpu"), "cpu"),
    "dict": ({"npu:0": "npu:3"}, "npu:3"),
    "dict_to_cpu": ({"npu:0": "cpu"}, "cpu"),
    "callable_npu1": (lambda storage, loc: storage.npu(1), "npu:1"),
    "callable_cpu": (lambda storage, loc: storage, "cpu"),
}


@pytest.mark.parametrize("weights_only", [False, True])
@pytest.mark.parametrize("name", sorted(MAP_LOCATIONS))
def test_map_location(name, weights_only):
    ml, expected_device = MAP_LOCATIONS[name]
    c = torch.randn(3, 4)
    obj = {"w": c.npu(), "i": torch.arange(5).npu()}
    out = _roundtrip(obj, map_location=ml, weights_only=weights_only)
    _same(out["w"], c, expected_device)
    _same(out["i"], torch.arange(5), expected_device)


def test_map_location_from_cpu_checkpoint_and_dict_other_keys():
    c = torch.randn(6)
    out = _roundtrip(c, map_location="npu:1")
    _same(out, c, "npu:1")
    out = _roundtrip(c, map_location={"cpu": "npu:2"})
    _same(out, c, "npu:2")
    # a dict that does not mention the saved location keeps it
    out = _roundtrip(c.to("npu:1"), map_location={"npu:0": "npu:3"})
    _same(out, c, "npu:1")
    # callable that receives the saved location string
    seen = []

    def ml(storage, loc):
        seen.append(loc)
        return None  # default handling

    out = _roundtrip(c.to("npu:2"), map_location=ml)
    assert seen == ["npu:2"]
    _same(out, c, "npu:2")


def test_views_keep_sharing_after_load():
    base = torch.arange(24, dtype=torch.float32).npu()
    obj = {"base": base, "view": base[2:10], "mat": base.view(4, 6), "t": base.view(4, 6).t()[1:]}
    for kw in ({}, {"weights_only": True}, {"map_location": "npu:2"}):
        out = _roundtrip(obj, **kw)
        b = out["base"]
        dev = str(b.device)
        for k in ("view", "mat", "t"):
            v = out[k]
            assert v.untyped_storage().data_ptr() == b.untyped_storage().data_ptr(), k
            assert v.storage_offset() == obj[k].storage_offset() and v.stride() == obj[k].stride()
            _same(v, obj[k], dev)
        out["view"][0] = -1.0
        assert b[2].item() == -1.0
        out["t"][0, 0] = -2.0  # t[1:][0,0] is mat[0,1] -> base[1]
        assert b[1].item() == -2.0 and out["mat"][0, 1].item() == -2.0


def test_load_from_missing_device_raises_clear_error(tmp_path):
    path = tmp_path / "dev5.pt"
    torch.save({"w": torch.arange(4.).to("npu:5")}, path)
    code = textwrap.dedent(f"""
        import sys, torch, torch_npu
        assert torch.npu.device_count() == 2, torch.npu.device_count()
        try:
            torch.load({str(path)!r})
        except RuntimeError as e:
            print("RAISED:", str(e).replace(chr(10), " "))
        else:
            print("NO-ERROR")
            sys.exit(3)
        out = torch.load({str(path)!r}, map_location="npu:1")
        assert out["w"].device == torch.device("npu:1"), out["w"].device
        assert out["w"].cpu().tolist() == [0.0, 1.0, 2.0, 3.0]
        out = torch.load({str(path)!r}, map_location={{"npu:5": "npu:0"}})
        assert out["w"].device == torch.device("npu:0")
        print("REMAP-OK")
    """)
    env = dict(os.environ, TORCH_NPU_EMU_DEVICE_COUNT="2", OMP_NUM_THREADS="1")
    env.pop("ASCEND_RT_VISIBLE_DEVICES", None)
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 0, f"rc={r.returncode}\nstdout:{r.stdout}\nstderr:{r.stderr[-3000:]}"
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("RAISED:"))
    assert "device_count" in line or "device count" in line.lower(), line
    assert "map_location" in line, line
    assert "REMAP-OK" in r.stdout


def test_truncated_and_corrupt_checkpoints_raise(tmp_path):
    path = tmp_path / "good.pt"
    torch.save({"w": torch.randn(256, 256).npu(), "b": torch.randn(10).npu()}, path)
    data = path.read_bytes()
    for cut in (len(data) // 2, 100, 10, 0):
        bad = tmp_path / f"trunc{cut}.pt"
        bad.write_bytes(data[:cut])
        with pytest.raises(Exception):
            torch.load(bad)
        with pytest.raises(Exception):
            torch.load(io.BytesIO(data[:cut]), weights_only=True)
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"\x00\x01not a checkpoint" * 64)
    with pytest.raises(Exception):
        torch.load(garbage)
    # the good file still loads
    out = torch.load(path)
    assert out["w"].device.type == "npu" and out["w"].shape == (256, 256)


def test_loaded_tensor_is_independent_copy():
    x = torch.ones(4).npu()
    y = _roundtrip(x)
    y.add_(1)
    assert x.sum().item() == 4.0 and y.sum().item() == 8.0
    # requires_grad survives for parameters
    p = nn.Parameter(torch.randn(3).npu())
    q = _roundtrip(p)
    assert isinstance(q, nn.Parameter) and q.requires_grad and q.device.type == "npu"
    q2 = copy.deepcopy(p)
    assert q2.device == p.device and torch.equal(q2.cpu(), p.detach().cpu())


def test_optimizer_checkpoint_resumed_on_other_npu():
    torch.manual_seed(3)
    model = nn.Linear(4, 3).npu()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    x = torch.randn(5, 4).npu()
    model(x).sum().backward()
    opt.step()
    ckpt = _roundtrip({"m": model.state_dict(), "o": opt.state_dict()}, map_location="npu:1")
    assert ckpt["o"]["state"][0]["exp_avg"].device == torch.device("npu:1")
    model1 = nn.Linear(4, 3).to("npu:1")
    model1.load_state_dict(ckpt["m"])
    opt1 = torch.optim.AdamW(model1.parameters(), lr=0.1)
    opt1.load_state_dict(ckpt["o"])
    for m, o, xx in ((model, opt, x), (model1, opt1, x.to("npu:1"))):
        o.zero_grad()
        m(xx).sum().backward()
        o.step()
    _same(model1.weight, model.weight, "npu:1")
    assert opt1.state[model1.weight]["exp_avg"].device == torch.device("npu:1")


def test_mmap_load(tmp_path):
    x = torch.randn(50).to("npu:2")
    path = tmp_path / "mm.pt"
    torch.save({"x": x, "v": x[5:9]}, path)
    out = torch.load(path, mmap=True)
    _same(out["x"], x, "npu:2")
    assert out["v"].untyped_storage().data_ptr() == out["x"].untyped_storage().data_ptr()
    out = torch.load(path, mmap=True, weights_only=True, map_location="npu:0")
    _same(out["v"], x[5:9], "npu:0")
    out = torch.load(path, mmap=True, map_location="cpu")
    _same(out["x"], x, "cpu")
