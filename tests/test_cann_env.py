"""The emulated CANN toolkit and the set_env.sh variables that ``import torch_npu`` exports.

Fresh interpreters check the import-time behaviour: each starts with no CANN
variable (``_CANN_UNSET``) and its own empty cache directory.
"""
import json
import os
import re
import subprocess
import sys
import time
import warnings

import pytest

import torch_npu
from torch_npu.utils import _cann_env

from _subproc import REPO, make_env, result, run_json, run_many

VARIABLES = ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH", "ASCEND_AICPU_PATH", "ASCEND_OPP_PATH", "TOOLCHAIN_HOME")
_CANN_UNSET = {name: None for name in VARIABLES + ("TORCH_NPU_EMU_CANN_ENV",)}

_SHOW_ENV = """
import json, os, subprocess, sys
import torch_npu
child = subprocess.run([sys.executable, "-c", "import json, os; print(json.dumps(dict(os.environ)))"],
                       capture_output=True, text=True, check=True)
names = %r
emit({"parent": {n: os.environ.get(n) for n in names},
      "child": {n: json.loads(child.stdout).get(n) for n in names}})
""" % (VARIABLES,)


def cann_env(tmp_path, **overrides):
    return dict(_CANN_UNSET, XDG_CACHE_HOME=str(tmp_path / "cache"), **overrides)


def read_install_info_version(home):
    """What DeepSpeed's op builders and the real torch_npu's collect_env do: walk the toolkit
    for ascend_*_install.info and take the value of its first line containing "version"."""
    for dirpath, _, filenames in os.walk(os.path.realpath(home)):
        for name in filenames:
            if re.match(r"ascend_.*_install\.info", name):
                with open(os.path.join(dirpath, name)) as f:
                    return next(line.strip().split("=")[-1] for line in f if "version" in line)
    return None


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """One fresh interpreter that imported torch_npu with no CANN variable and an empty cache."""
    return run_json(_SHOW_ENV, env=cann_env(tmp_path_factory.mktemp("cann")))


def test_import_exports_set_env_variables_for_the_process_and_its_children(imported):
    r = imported
    home = r["parent"]["ASCEND_HOME_PATH"]
    assert f"{os.sep}cache{os.sep}torch_npu{os.sep}" in home and home.endswith("ascend-toolkit/latest")
    # set_env.sh's relations between the variables.
    assert r["parent"] == {"ASCEND_TOOLKIT_HOME": home, "ASCEND_HOME_PATH": home, "ASCEND_AICPU_PATH": home,
                           "ASCEND_OPP_PATH": home + "/opp", "TOOLCHAIN_HOME": home + "/toolkit"}
    assert r["child"] == r["parent"]


def test_the_toolkit_has_the_files_clients_read(imported):
    home = imported["parent"]["ASCEND_HOME_PATH"]
    cann = torch_npu.version.cann
    assert read_install_info_version(home) == cann
    arch = f"{os.uname().machine}-linux"
    with open(os.path.join(home, arch, "ascend_toolkit_install.info")) as f:
        info = dict(line.strip().split("=", 1) for line in f if "=" in line)
    assert info["package_name"] == "Ascend-cann-toolkit" and info["version"] == cann
    with open(os.path.join(home, "version.cfg")) as f:
        cfg = dict(line.strip().split("=", 1) for line in f if "=" in line)
    assert cfg["toolkit_running_version"].strip("[]").split(":")[-1] == cann
    assert cfg["runtime_running_version"].strip("[]").split(":")[-1] == cann
    with open(os.path.join(home, "compiler", "version.info")) as f:
        assert re.search(r"^Version=(.*)$", f.read(), re.M).group(1) == cann
    # What the real torch_npu's CANN check requires when ASCEND_HOME_PATH is set.
    for sub in ("runtime", "compiler", "opp", "lib64", "include", "toolkit"):
        assert os.path.isdir(os.path.join(home, sub)), sub
    # latest -> <version>, and set_env.sh beside them, as an installed toolkit has them.
    assert os.readlink(home) == cann
    toolkit = os.path.dirname(home)
    with open(os.path.join(toolkit, "set_env.sh")) as f:
        script = f.read()
    assert script.splitlines()[1:] == _cann_env.export_lines(home)


def test_set_env_sh_exports_what_the_import_would(imported):
    home = imported["parent"]["ASCEND_HOME_PATH"]
    script = os.path.join(os.path.dirname(home), "set_env.sh")
    out = subprocess.run(["bash", "-c", f". {script} && env"], capture_output=True, text=True, check=True,
                         env={"PATH": os.environ["PATH"]}).stdout
    exported = dict(line.split("=", 1) for line in out.splitlines() if line.split("=", 1)[0] in VARIABLES)
    assert exported == _cann_env.variables_for(home)


def test_user_values_are_never_overridden(tmp_path):
    own = tmp_path / "own-cann"
    own.mkdir()
    jobs = {
        # Their own CANN root: nothing is added to it, nor mixed with the emulated toolkit.
        "home": (_SHOW_ENV, cann_env(tmp_path, ASCEND_HOME_PATH=own)),
        "toolkit": (_SHOW_ENV, cann_env(tmp_path, ASCEND_TOOLKIT_HOME=own)),
        # Only a non-root variable: it stays, the others are filled in.
        "opp": (_SHOW_ENV, cann_env(tmp_path, ASCEND_OPP_PATH=own)),
        "off": (_SHOW_ENV, cann_env(tmp_path, TORCH_NPU_EMU_CANN_ENV="0")),
    }
    r = run_many(jobs)
    unset = {n: None for n in VARIABLES}
    assert result(r, "home")["parent"] == dict(unset, ASCEND_HOME_PATH=str(own))
    assert result(r, "toolkit")["parent"] == dict(unset, ASCEND_TOOLKIT_HOME=str(own))
    opp = result(r, "opp")["parent"]
    assert opp["ASCEND_OPP_PATH"] == str(own)
    assert opp["ASCEND_HOME_PATH"].endswith("ascend-toolkit/latest")
    assert result(r, "off")["parent"] == unset
    assert result(r, "off")["child"] == unset


def test_switch_off_creates_nothing_and_a_bad_value_is_an_error(tmp_path):
    run_json("import torch_npu\nemit(1)", env=cann_env(tmp_path, TORCH_NPU_EMU_CANN_ENV="0"))
    assert not (tmp_path / "cache").exists()
    proc = subprocess.run([sys.executable, "-c", "import torch_npu"], cwd=str(REPO), capture_output=True, text=True,
                          env=make_env(**cann_env(tmp_path, TORCH_NPU_EMU_CANN_ENV="yes")), timeout=180)
    assert proc.returncode != 0
    assert "ValueError: Invalid value for TORCH_NPU_EMU_CANN_ENV: yes. Only '0' or '1' is supported." in proc.stderr


_RACE = """
import os, time
import torch_npu
from torch_npu.utils import _cann_env
time.sleep(max(0.0, float(os.environ["START_AT"]) - time.time()))
emit(_cann_env.toolkit_home())
"""


def test_concurrent_ranks_create_one_toolkit(tmp_path):
    # Imported with the switch off, then all call toolkit_home() at the same instant.
    start = time.time() + 25
    env = cann_env(tmp_path, TORCH_NPU_EMU_CANN_ENV="0", START_AT=start)
    r = run_many({f"rank{i}": (_RACE, env) for i in range(4)}, timeout=240)
    homes = {result(r, f"rank{i}") for i in range(4)}
    assert len(homes) == 1
    home = homes.pop()
    assert read_install_info_version(home) == torch_npu.version.cann
    parent = os.path.dirname(os.path.dirname(home))
    assert os.listdir(parent) == ["ascend-toolkit"]  # the losers' staging trees are gone


def test_unwritable_cache_falls_back_then_fails_with_a_clear_error(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    fallback = tmp_path / "fallback"
    monkeypatch.setattr(_cann_env, "_candidate_roots", lambda: [str(blocker / "cache"), str(fallback)])
    home = _cann_env.toolkit_home()
    assert home.startswith(str(fallback)) and read_install_info_version(home) == torch_npu.version.cann

    monkeypatch.setattr(_cann_env, "_candidate_roots", lambda: [str(blocker / "a"), str(blocker / "b")])
    with pytest.raises(OSError, match="cannot create the emulated CANN toolkit; tried .*not-a-dir/a.*not-a-dir/b"):
        _cann_env.toolkit_home()
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("TORCH_NPU_EMU_CANN_ENV", raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _cann_env.apply_to_process_env() == {}
    assert any("the CANN environment variables are not set" in str(w.message) for w in caught)
    assert not any(os.environ.get(name) for name in VARIABLES)


def test_an_existing_toolkit_is_reused_without_writing(tmp_path, monkeypatch):
    monkeypatch.setattr(_cann_env, "_candidate_roots", lambda: [str(tmp_path)])
    home = _cann_env.toolkit_home()

    def no_create(toolkit):
        raise AssertionError("the toolkit was created again")
    monkeypatch.setattr(_cann_env, "_create", no_create)
    assert _cann_env.toolkit_home() == home


def test_cli_env_prints_export_lines_that_a_shell_can_eval(tmp_path):
    env = make_env(**cann_env(tmp_path))
    proc = subprocess.run([sys.executable, "-m", "torch_npu", "env"], cwd=str(REPO), env=env, capture_output=True,
                          text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert [line.split("=", 1)[0] for line in lines] == [f"export {name}" for name in VARIABLES]
    # The shell that evals them hands them to its programs; doctor sees where they point.
    shell = subprocess.run(["bash", "-c", f'eval "$({sys.executable} -m torch_npu env)" && '
                                          f'{sys.executable} -m torch_npu doctor --format json'],
                           cwd=str(REPO), env=env, capture_output=True, text=True, timeout=300)
    assert shell.returncode == 0, shell.stderr[-2000:]
    report = json.loads(shell.stdout)
    check = next(c for c in report["checks"] if c["check"] == "CANN environment")
    assert check["status"] == "ok"
    assert f"{', '.join(VARIABLES)}: {_cann_env.INHERITED_EMULATED}" in check["detail"]
    assert report["settings"]["ASCEND_HOME_PATH"] == lines[1].split("=", 1)[1]


_DOCTOR_CHECK = """
from torch_npu.cli.doctor import collect
emit(next(c for c in collect()["checks"] if c["check"] == "CANN environment"))
"""


def test_doctor_says_who_set_the_cann_variables(tmp_path):
    own = tmp_path / "own-cann"
    own.mkdir()
    r = run_many({
        "package": (_DOCTOR_CHECK, cann_env(tmp_path)),
        "user": (_DOCTOR_CHECK, cann_env(tmp_path, ASCEND_HOME_PATH=own, ASCEND_OPP_PATH=own)),
        "missing": (_DOCTOR_CHECK, cann_env(tmp_path, ASCEND_HOME_PATH=tmp_path / "nowhere")),
        "off": (_DOCTOR_CHECK, cann_env(tmp_path, TORCH_NPU_EMU_CANN_ENV="0")),
    })
    package = result(r, "package")
    assert package["status"] == "ok"
    assert f"{', '.join(VARIABLES)}: {_cann_env.SET_AT_IMPORT}" in package["detail"]
    user = result(r, "user")
    assert user["status"] == "ok" and f"ASCEND_HOME_PATH={own};" in user["detail"]
    assert f"ASCEND_HOME_PATH, ASCEND_OPP_PATH: {_cann_env.USER}" in user["detail"]
    missing = result(r, "missing")
    assert missing["status"] == "warn" and f"ASCEND_HOME_PATH={tmp_path / 'nowhere'}" in missing["detail"]
    off = result(r, "off")
    assert off["status"] == "warn" and "ASCEND_HOME_PATH is unset" in off["detail"]
