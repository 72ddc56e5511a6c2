"""``torch-npu doctor``: is this environment ready, and what will client libraries see?

Checks (each ``ok`` / ``warn`` / ``fail``, each failure with its fix; exit code 1 when any
fails): versions, a second (real) torch_npu installed beside this one, the ``torch.backends``
autoload entry point and ``TORCH_DEVICE_BACKEND_AUTOLOAD``, the emulator variables, the
emulated devices, AMP dtypes, the ``hccl`` backend, whether the installed stack
(torchvision, torchaudio, transformers, accelerate, peft, diffusers, deepspeed, lightning,
timm) imports and is built for this torch, and for accelerate, transformers, deepspeed (and
peft, diffusers, lightning) which device they will pick. An installed library is
asked through its own detection function; for one that is not installed, the answer is
predicted from its detection rule (import torch_npu succeeds and torch.npu.is_available()).
"""
import importlib
import importlib.metadata
import json
import os
import platform
import re
import subprocess
import sys

import click


SETTINGS = ("ASCEND_RT_VISIBLE_DEVICES", "TORCH_NPU_EMU_DEVICE_COUNT", "TORCH_NPU_EMU_DEVICE_NAME",
            "TORCH_NPU_EMU_MEMORY", "TORCH_NPU_EMU_AUTOGRAD_THREADS", "PYTORCH_NPU_ALLOC_CONF",
            "PYTORCH_NO_NPU_MEMORY_CACHING", "TORCH_NPU_FALLBACK_CPU_DISABLE", "TORCH_TRANSFER_TO_NPU",
            "TORCH_DEVICE_BACKEND_AUTOLOAD", "ASCEND_HOME_PATH", "DS_ACCELERATOR", "ACCELERATE_TORCH_DEVICE")


def _version(package):
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _ask(module, function):
    """Call a library's own detection function; ``None`` if it cannot be asked."""
    try:
        return bool(getattr(importlib.import_module(module), function)())
    except Exception:
        return None


def _clients(npu_ok):
    predicted = "npu" if npu_ok else "cpu/cuda (no usable npu)"
    out = []
    for package, module, function in (("accelerate", "accelerate.utils", "is_npu_available"),
                                       ("transformers", "transformers.utils", "is_torch_npu_available"),
                                       ("peft", None, None), ("diffusers", "diffusers.utils", "is_torch_npu_available")):
        version = _version(package)
        entry = {"library": package, "version": version}
        answer = _ask(module, function) if (version and module) else None
        if answer is not None:
            entry.update(detects="npu" if answer else "not npu", how=f"{module}.{function}()")
        else:
            entry.update(detects=predicted, how="predicted: switches to npu when import torch_npu succeeds")
        out.append(entry)
    ds = {"library": "deepspeed", "version": _version("deepspeed")}
    from torch_npu import _settings
    forced = _settings.raw("DS_ACCELERATOR")
    ds["detects"] = forced if forced else predicted
    ds["how"] = "DS_ACCELERATOR" if forced else "predicted: its accelerator probe picks npu once torch_npu imports"
    home = _settings.raw("ASCEND_HOME_PATH")
    if ds["version"] and ds["detects"] == "npu" and not (home and os.path.isdir(home)):
        ds["warning"] = ("ASCEND_HOME_PATH is not an existing directory: DeepSpeed's NPU op builders and ds_report "
                         "read it unguarded (KeyError); unset TORCH_NPU_EMU_CANN_ENV=0, eval \"$(torch-npu env)\", or set DS_ACCELERATOR=cpu")
    out.append(ds)
    out.append({"library": "lightning", "version": _version("lightning") or _version("pytorch-lightning"),
                "detects": "cpu", "how": "no accelerator='npu' in Lightning: needs a user-written Accelerator"})
    return out


def _cann_environment():
    """(status, detail) of the CANN variables: each one's source (set by torch_npu at import,
    inherited from the shell, unset) and whether the directories they name exist."""
    from torch_npu.utils import _cann_env
    origins = _cann_env.origins()
    by_source = {}
    for name, entry in origins.items():
        by_source.setdefault(entry["source"], []).append(name)
    parts = [f"{', '.join(names)}: {source}" for source, names in by_source.items()]
    missing = [f"{name}={entry['value']}" for name, entry in origins.items()
               if entry["value"] and not os.path.isdir(entry["value"])]
    home = origins["ASCEND_HOME_PATH"]["value"]
    if missing:
        return "warn", "not existing directories: " + ", ".join(missing) + "; " + "; ".join(parts)
    if not home:
        return "warn", ("ASCEND_HOME_PATH is unset (DeepSpeed's NPU op builders fail with KeyError): "
                        f"unset {_cann_env.SWITCH}=0, or eval \"$(torch-npu env)\"; " + "; ".join(parts))
    return "ok", f"ASCEND_HOME_PATH={home}; " + "; ".join(parts)


def _finding(name, status, detail):
    return {"check": name, "status": status, "detail": detail}


def check_torch_npu_distributions():
    """Exactly one installed distribution provides ``torch_npu``, and it is this emulator
    (``+emu`` version): a real torch_npu wheel installed too shadows or mixes with it."""
    found = []
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("-", "_")
        files = dist.files or []
        provides = name == "torch_npu" or any(str(f).startswith("torch_npu/__init__.py") for f in files)
        if provides:
            found.append((dist.metadata["Name"], dist.version, str(dist.locate_file(""))))
    real = [d for d in found if "+emu" not in d[1]]
    listing = "; ".join(f"{n} {v} in {where}" for n, v, where in found)
    if real:
        return [_finding("torch_npu installations", "fail",
                         f"a torch_npu that is not this emulator is installed ({listing}): the two overwrite each "
                         f"other's files. Fix: pip uninstall -y torch_npu (repeat until none is left), then "
                         f"reinstall this one (make install, or pip install <this repository>)")]
    if len(found) > 1:
        return [_finding("torch_npu installations", "warn",
                         f"{len(found)} installations provide torch_npu ({listing}). Fix: pip uninstall -y "
                         f"torch_npu until none is left, then reinstall one")]
    return [_finding("torch_npu installations", "ok", listing or "none registered (run from a source tree)")]


def check_autoload_variable():
    """``TORCH_DEVICE_BACKEND_AUTOLOAD``: unset or 1 lets ``import torch`` load torch_npu."""
    value = os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD")
    if value is None:
        return [_finding("TORCH_DEVICE_BACKEND_AUTOLOAD", "ok", "unset: import torch loads torch_npu")]
    if value == "1":
        return [_finding("TORCH_DEVICE_BACKEND_AUTOLOAD", "ok", "1: import torch loads torch_npu")]
    if value == "0":
        return [_finding("TORCH_DEVICE_BACKEND_AUTOLOAD", "warn",
                         "0: import torch does not load torch_npu, so scripts and client libraries that do not "
                         "import torch_npu themselves see no npu device. Fix: unset TORCH_DEVICE_BACKEND_AUTOLOAD")]
    return [_finding("TORCH_DEVICE_BACKEND_AUTOLOAD", "warn",
                     f"{value!r} is neither 0 nor 1. Fix: unset it (or set 1)")]


def check_emulator_settings():
    """Every variable of the settings registry (``torch_npu._settings``) that is set parses:
    the same strict parser the package uses when the variable takes effect."""
    from torch_npu import _settings
    out = []
    for name in sorted(_settings.SETTINGS):
        if not _settings.is_set(name):
            continue
        try:
            _settings.get(name)
        except _settings.SettingError as e:
            out.append(_finding("emulator settings", "fail",
                                f"{e}. Fix: correct or unset {name} (see docs/settings.md)"))
    if not out:
        out.append(_finding("emulator settings", "ok", "every torch_npu variable that is set parses"))
    return out


# Libraries a training stack imports on top of torch: distribution name, module to import.
STACK = (("torchvision", "torchvision"), ("torchaudio", "torchaudio"), ("transformers", "transformers"),
         ("accelerate", "accelerate"), ("peft", "peft"), ("diffusers", "diffusers"), ("deepspeed", "deepspeed"),
         ("lightning", "lightning"), ("pytorch-lightning", "pytorch_lightning"), ("timm", "timm"))
IMPORT_TIMEOUT_S = 300


def _matching_release(package, torch_version):
    """The release of a torch-versioned library built for ``torch_version``, or ``None``."""
    major, minor = (int(x) for x in torch_version.split(".")[:2])
    if package == "torchvision" and major == 2:
        return f"0.{minor + 15}"
    if package == "torchaudio":
        return f"{major}.{minor}"
    return None


def _pinned_torch(package):
    """The torch versions a library's metadata pins exactly (``torch==X``), without extras."""
    pins = []
    for req in importlib.metadata.requires(package) or []:
        if "extra ==" in req:
            continue
        m = re.match(r"torch\s*(\(?)\s*==\s*([\w.+]+)", req)
        if m:
            pins.append(m.group(2))
    return pins


_IMPORT_ALL = r"""
import json, sys, traceback
for module in sys.argv[1:]:
    try:
        __import__(module)
        result = None
    except BaseException as e:
        lines = [l for l in traceback.format_exception_only(type(e), e)[-1].strip().splitlines() if l.strip()]
        result = lines[-1] if lines else type(e).__name__
    print(json.dumps([module, result]), flush=True)
"""


def _installed_stack():
    return [(dist, module, _version(dist)) for dist, module in STACK if _version(dist)]


def start_stack_imports():
    """Start the interpreter that imports the installed stack (see ``check_stack_imports``), so
    that it runs while doctor does the rest; ``None`` when nothing is installed."""
    modules = [module for _, module, _ in _installed_stack()]
    if not modules:
        return None
    proc = subprocess.Popen([sys.executable, "-c", _IMPORT_ALL, *modules], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    return proc, modules


def _import_results(started, timeout):
    """{module: None (imports) | error line}; a hang or a crash is charged to the module that
    was importing, and the modules after it are missing."""
    if started is None:
        return {}
    proc, modules = started
    try:
        out, err = proc.communicate(timeout=timeout)
        stopped = None
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        stopped = f"timeout: not imported within {timeout} s"
    results = {}
    for line in out.splitlines():
        try:
            module, error = json.loads(line)
        except ValueError:
            continue
        results[module] = error
    for module in modules:
        if module not in results:
            lines = [line for line in err.strip().splitlines() if line.strip()]
            results[module] = stopped or f"the interpreter died (exit status {proc.returncode})" + \
                (f": {lines[-1]}" if lines else "")
            break  # the rest were never tried
    return results


def check_stack_imports(torch_version, started=None, timeout=IMPORT_TIMEOUT_S):
    """Each installed stack library imports (in a separate interpreter, with a timeout) and is
    built for the installed torch: torchvision/torchaudio pin one torch release, and a build for
    another one fails at import (``operator torchvision::nms does not exist``). ``started``: the
    handle of ``start_stack_imports()`` when the imports were started earlier."""
    installed = _installed_stack()
    imported = _import_results(started if started is not None else start_stack_imports(), timeout)
    out = []
    base = torch_version.split("+")[0]
    vision_fix = f"pip install 'torchvision=={_matching_release('torchvision', base)}.*' --index-url " \
                 f"https://download.pytorch.org/whl/cpu"
    for dist, module, version in installed:
        match = _matching_release(dist, base)
        fix = (f"pip install '{dist}=={match}.*' --index-url https://download.pytorch.org/whl/cpu"
               if match else f"pip install -U {dist} -c <a file with torch=={base}>")
        pins = [p for p in _pinned_torch(dist) if p.split("+")[0] != base]
        if module not in imported:
            out.append(_finding(f"{dist} {version}", "warn", f"import {module} not tried: an earlier import "
                                                             f"stopped the check"))
            continue
        error = imported[module]
        if error is not None:
            built_for = f" (built for torch {pins[0]})" if pins else ""
            if dist != "torchvision" and "torchvision::" in error:  # fails in the torchvision it imports
                fix = f"the torchvision built for torch {base}: {vision_fix}"
            out.append(_finding(f"{dist} {version}", "fail", f"import {module} fails{built_for}: {error}. Fix: {fix}"))
        elif pins:
            out.append(_finding(f"{dist} {version}", "warn",
                                f"built for torch {pins[0]}, installed torch {torch_version}. Fix: {fix}"))
        else:
            out.append(_finding(f"{dist} {version}", "ok", "imports"))
    return out


def collect():
    """Everything ``doctor`` prints, as a dict with a ``checks`` list."""
    checks = []

    def check(name, status, detail):
        checks.append({"check": name, "status": status, "detail": detail})

    checks += check_autoload_variable()  # before torch_npu's import touches the variable
    stack_imports = start_stack_imports()  # runs while this process imports torch
    import torch
    import torch_npu
    from torch_npu import _settings
    check("torch version", "ok" if torch.__version__.split("+")[0] == "2.13.0" else "fail",
          f"torch {torch.__version__} (torch_npu {torch_npu.__version__} needs 2.13.0)")
    checks += check_torch_npu_distributions()
    settings = check_emulator_settings()
    checks += settings
    entry_points = importlib.metadata.entry_points(group="torch.backends")
    autoload = any(ep.name == "torch_npu" for ep in entry_points)
    check("autoload entry point", "ok" if autoload else "warn",
          "import torch loads torch_npu" if autoload else "missing: scripts must import torch_npu themselves")
    # With a setting that does not parse, the first device use raises: reported above instead.
    available = torch.npu.is_available() and all(c["status"] != "fail" for c in settings)
    count = torch.npu.device_count() if available else 0
    check("npu devices", "ok" if available and count else "fail", f"{count} visible")
    devices = []
    for d in range(count):
        props = torch.npu.get_device_properties(d)
        devices.append({"device": f"npu:{d}", "name": props.name, "total_memory_bytes": props.total_memory})
    try:
        amp_dtypes = [str(t).replace("torch.", "") for t in torch.npu.get_amp_supported_dtype()]
    except Exception as e:  # reported, not fatal
        amp_dtypes = [f"error: {e}"]
    check("autocast dtypes", "ok" if amp_dtypes and not amp_dtypes[0].startswith("error") else "warn",
          ", ".join(amp_dtypes) + f"; bf16 supported: {torch.npu.is_bf16_supported()}")
    hccl = torch.distributed.is_available() and torch.distributed.is_backend_available("hccl")
    check("hccl backend", "ok" if hccl else "warn",
          "registered" if hccl else "not registered: distributed npu training cannot start")
    check("CANN environment", *_cann_environment())
    checks += check_stack_imports(torch.__version__, stack_imports)
    clients = _clients(available and count > 0)
    for c in clients:
        if c.get("warning"):
            check(f"{c['library']}", "warn", c["warning"])
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_npu": torch_npu.__version__,
        "torch_npu_path": os.path.dirname(torch_npu.__file__),
        "cann (emulated)": torch_npu.emulator.cann_version(),
        "emulator": torch_npu.emulator.config(),
        "settings": {k: _settings.raw(k) for k in SETTINGS},
        "devices": devices,
        "clients": clients,
        "checks": checks,
    }


def _text(r):
    lines = [f"torch {r['torch']}  torch_npu {r['torch_npu']}  CANN {r['cann (emulated)']} (emulated)  "
             f"python {r['python']}",
             f"torch_npu at {r['torch_npu_path']}", "", "checks:"]
    lines += [f"  [{c['status']:4}] {c['check']}: {c['detail']}" for c in r["checks"]]
    lines += ["", "devices (emulated):"]
    lines += [f"  {d['device']}: {d['name']}, {d['total_memory_bytes'] / 2**30:.1f} GiB" for d in r["devices"]]
    lines += ["", "settings:"]
    lines += [f"  {k}={v}" for k, v in r["settings"].items() if v is not None] or ["  (all defaults)"]
    lines += ["", "client libraries:"]
    for c in r["clients"]:
        lines.append(f"  {c['library']} {c['version'] or '(not installed)'}: detects {c['detects']} ({c['how']})")
    return "\n".join(lines)


@click.command()
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.pass_context
def doctor(ctx, fmt):
    """Check the environment: versions, emulated devices, settings, what client libraries detect."""
    report = collect()
    click.echo(json.dumps(report, indent=2) if fmt == "json" else _text(report))
    ctx.exit(1 if any(c["status"] == "fail" for c in report["checks"]) else 0)
