"""``torch_npu.contrib.transfer_to_npu``: CUDA calls land on the NPU.

The patch is global and irreversible, so every check runs in a fresh interpreter; the
reference is the same computation written for the NPU (or the CPU) in that interpreter.
"""
from _subproc import run_json, run_many, result

PATCHED = r'''
import warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import torch, torch_npu
    import torch_npu.contrib.transfer_to_npu
    import torch_npu.contrib.transfer_to_npu  # a second import patches nothing again
import torch.nn as nn
r = {}
r["banner"] = sum(1 for w in caught if issubclass(w.category, ImportWarning) and "hccl" in str(w.message))
r["jit_warning"] = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
r["available"] = [torch.cuda.is_available(), torch.cuda.device_count(), torch.npu.device_count()]
r["factories"] = [str(torch.zeros(2, device="cuda").device), str(torch.ones(2, device="cuda:1").device),
                  str(torch.empty(2, device=torch.device("cuda", 2)).device),
                  str(torch.arange(3, device="cuda:0").device)]
x = torch.ones(2)
r["methods"] = [str(x.cuda().device), str(x.to("cuda:1").device), str(x.to(3).device),
                str(x.npu().new_zeros(2, device="cuda:2").device), x.cuda().is_cuda, x.is_cuda]
m = nn.Linear(2, 2).cuda()
r["module"] = [str(m.weight.device), str(m.to("cuda:1").weight.device), str(m.to(0).weight.device)]
g = torch.Generator("cuda")
r["generator"] = [str(g.device), isinstance(g, torch.Generator), isinstance(torch.default_generator, torch.Generator),
                  isinstance(torch.npu.default_generators[0], torch.Generator)]
e = torch.Event("cuda")
r["event"] = [e.device.type, isinstance(e, torch.Event)]
torch.cuda.set_device("cuda:1")
r["set_device"] = [torch.cuda.current_device(), torch.npu.current_device()]
torch.cuda.set_device(0)
a = torch.randn(8, 8, device="cuda")
with torch.autocast("cuda", dtype=torch.float16):
    r["autocast"] = [str((a @ a).dtype), torch.is_autocast_enabled(), torch.is_autocast_enabled("cuda")]
with torch.cuda.amp.autocast(dtype=torch.bfloat16):
    r["cuda_amp"] = str((a @ a).dtype)
r["scaler"] = type(torch.cuda.amp.GradScaler()).__module__
from torch.cuda.amp import GradScaler
r["from_import"] = GradScaler is torch.npu.amp.GradScaler
import tempfile, os
d = tempfile.mkdtemp()
p = os.path.join(d, "ckpt_cuda.pt")          # "cuda" in a file name is not a device
torch.save({"w": torch.arange(4.0, device="npu")}, p)
r["load"] = [str(torch.load(p, map_location="cuda:1")["w"].device),
             str(torch.load(p, map_location={"npu:0": "cuda:2"})["w"].device),
             str(torch.load(p, map_location=torch.device("cuda", 3))["w"].device)]
import torch.distributed as dist
r["nccl"] = [dist.is_nccl_available() == ("hccl" in dist.Backend.backend_list),
             "cuda" in dist.Backend.default_device_backend_map]
r["jit"] = torch.jit.script(m) is m
r["triton"] = __import__("torch.utils._triton", fromlist=["x"]).has_triton()
r["double"] = torch.cuda.DoubleTensor is torch.npu.FloatTensor if hasattr(torch.npu, "FloatTensor") else None
from torch_npu.contrib._transfer import rewrite
r["records"] = sorted({(x["api"], x["original"]) for x in rewrite.records()})[:3]
r["sites_ok"] = all(x["site"].startswith("<string>:") for x in rewrite.records())
emit(r)
'''


def test_transfer_to_npu_patches():
    r = run_json(PATCHED)
    assert r["banner"] == 1
    assert r["jit_warning"] == ["torch.jit.script and torch.jit.script_method will be disabled by transfer_to_npu, "
                                "which currently does not support them, if you need to enable them, please do not "
                                "use transfer_to_npu."]
    assert r["available"] == [True, r["available"][2], r["available"][2]] and r["available"][2] >= 4
    assert r["factories"] == ["npu:0", "npu:1", "npu:2", "npu:0"]
    assert r["methods"] == ["npu:0", "npu:1", "npu:3", "npu:2", True, False]
    assert r["module"] == ["npu:0", "npu:1", "npu:0"]
    assert r["generator"] == ["npu:0", True, True, True]
    assert r["event"] == ["npu", True]
    assert r["set_device"] == [1, 1]
    assert r["autocast"] == ["torch.float16", True, True]
    assert r["cuda_amp"] == "torch.bfloat16"
    assert r["scaler"].startswith("torch_npu.npu.amp")
    assert r["from_import"] is True
    assert r["load"] == ["npu:1", "npu:2", "npu:3"]
    assert r["nccl"] == [True, False]
    assert r["jit"] is True and r["triton"] is False
    assert r["double"] in (True, None)
    assert r["records"] and r["sites_ok"]


def test_env_var_and_its_values():
    jobs = {
        "on": ("import torch\nemit([str(torch.zeros(1, device='cuda').device), torch.cuda.is_available()])",
               {"TORCH_TRANSFER_TO_NPU": "1"}),
        "off": ("import torch\nemit([torch.cuda.is_available(), "
                "'torch_npu.contrib.transfer_to_npu' in __import__('sys').modules])",
                {"TORCH_TRANSFER_TO_NPU": "0"}),
        "bad": ("import os\nos.environ['TORCH_DEVICE_BACKEND_AUTOLOAD'] = '0'\nimport torch\n"
                "emit(catch(lambda: __import__('torch_npu')))", {"TORCH_TRANSFER_TO_NPU": "yes"}),
        "rank1": ("import warnings\nwith warnings.catch_warnings(record=True) as w:\n"
                  "    warnings.simplefilter('always')\n    import torch, torch_npu.contrib.transfer_to_npu\n"
                  "emit(sum(issubclass(x.category, ImportWarning) for x in w))", {"RANK": "1"}),
    }
    out = run_many(jobs)
    assert result(out, "on") == ["npu:0", True]
    assert result(out, "off") == [False, False]
    assert result(out, "bad")[:2] == ["ValueError", "Invalid value for TORCH_TRANSFER_TO_NPU: yes. Only '0' or '1' "
                                                    "is supported."]
    assert result(out, "rank1") == 0  # the banner is printed by rank 0 only


def test_training_step_equals_npu_code():
    code = r'''
import torch, torch_npu
def step(dev):
    torch.manual_seed(0)
    m = torch.nn.Linear(4, 1).to(dev)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    x = torch.arange(8.0).reshape(2, 4).to(dev)
    loss = m(x).pow(2).mean(); loss.backward(); opt.step()
    return [loss.item()] + m.weight.detach().cpu().flatten().tolist()
ref = step("npu")
import torch_npu.contrib.transfer_to_npu
emit([ref, step("cuda"), step(torch.device("cuda", 0))])
'''
    ref, via_cuda, via_device = run_json(code)
    assert via_cuda == ref and via_device == ref


def test_profilers_still_work_under_the_patch():
    # A CUDA script that profiles: torch.profiler with CPU + CUDA activities, and
    # the legacy autograd profiler, both record the npu ops.
    out = run_json("""
import torch, torch_npu
import torch_npu.contrib.transfer_to_npu
from torch.profiler import profile, ProfilerActivity
x = torch.ones(64, 64).cuda()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
    torch.mm(x, x)
names = {e.key for e in p.key_averages()}
with torch.autograd.profiler.profile() as q:
    torch.mm(x, x)
emit([str(x.device), "aten::mm" in names, "aten::mm" in {e.key for e in q.key_averages()}])
""")
    assert out == ["npu:0", True, True]


_NOTICES = r'''
import os, subprocess, sys, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import torch, torch_npu
    import torch_npu.contrib.transfer_to_npu
def count(ws):
    return [sum(1 for w in ws if issubclass(w.category, ImportWarning) and "hccl" in str(w.message)),
            sum(1 for w in ws if issubclass(w.category, RuntimeWarning) and "torch.jit.script" in str(w.message))]
# A "rank" this process starts, as torch_npu_run / torchrun / mp.spawn do: it inherits the environment.
child = ("import warnings, json\nwith warnings.catch_warnings(record=True) as ws:\n"
         "    warnings.simplefilter('always')\n    import torch, torch_npu.contrib.transfer_to_npu\n"
         "print(json.dumps([sum(1 for w in ws if issubclass(w.category, ImportWarning) and 'hccl' in str(w.message)),"
         " sum(1 for w in ws if issubclass(w.category, RuntimeWarning) and 'torch.jit.script' in str(w.message))]))")
ranks = []
for rank in ("0", "1"):
    env = dict(os.environ, RANK=rank, LOCAL_RANK=rank)
    out = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True, timeout=120)
    ranks.append(__import__("json").loads(out.stdout.strip().splitlines()[-1]))
emit({"launcher": count(caught), "ranks": ranks})
'''


def test_banner_and_jit_warning_once_per_job_unless_verbose():
    out = run_many({
        "quiet": (_NOTICES, {"ASCEND_GLOBAL_LOG_LEVEL": None}),
        "verbose": (_NOTICES, {"ASCEND_GLOBAL_LOG_LEVEL": "1"}),
    }, timeout=400)
    # The launcher prints the banner and the jit warning; the ranks it starts print nothing.
    assert result(out, "quiet") == {"launcher": [1, 1], "ranks": [[0, 0], [0, 0]]}
    # ASCEND_GLOBAL_LOG_LEVEL=1 (info): every process prints them, as before.
    assert result(out, "verbose") == {"launcher": [1, 1], "ranks": [[1, 1], [1, 1]]}
