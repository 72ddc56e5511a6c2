"""Client detection paths and CANN's environment: which need it, which do not.

accelerate and transformers detect the NPU by importing torch_npu and asking
``torch.npu.is_available()``; neither reads a CANN variable or file, so they
must answer the same with the emulated CANN environment switched off.
DeepSpeed's paths, which do read it, are in ``test_deepspeed.py``.
"""
import json
import subprocess

import pytest

from _clients import CANN_VARIABLES, PYTHON, launcher_env, require

require("accelerate")
require("transformers")

_PROBE = r"""
import importlib, json, os
answers = {}
for module, function in (("accelerate.utils", "is_npu_available"), ("transformers.utils", "is_torch_npu_available")):
    answers[module] = bool(getattr(importlib.import_module(module), function)())
print(json.dumps({"answers": answers, "cann": {n: os.environ.get(n) for n in %r}}))
""" % (CANN_VARIABLES,)


@pytest.mark.parametrize("switch", ["1", "0"])
def test_accelerate_and_transformers_detect_the_npu_with_or_without_cann_variables(switch):
    proc = subprocess.run([PYTHON, "-c", _PROBE], env=launcher_env(TORCH_NPU_EMU_CANN_ENV=switch),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["answers"] == {"accelerate.utils": True, "transformers.utils": True}
    # The switch did what it says, so the answers above cover both cases.
    assert all(v is None for v in found["cann"].values()) == (switch == "0")
