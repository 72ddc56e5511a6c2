"""``torch-npu doctor``: is this environment ready, and what will client libraries see?

Checks (each ``ok`` / ``warn`` / ``fail``; exit code 1 when any fails): versions, the
``torch.backends`` autoload entry point, the emulated devices and their settings, AMP dtypes,
the ``hccl`` backend, and for accelerate, transformers, deepspeed (and peft, diffusers,
lightning) the installed version and which device they will pick. An installed library is
asked through its own detection function; for one that is not installed, the answer is
predicted from its detection rule (import torch_npu succeeds and torch.npu.is_available()).
"""
import importlib
import importlib.metadata
import json
import os
import platform

import click

from torch_npu import _settings

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
    forced = _settings.raw("DS_ACCELERATOR")
    ds["detects"] = forced if forced else predicted
    ds["how"] = "DS_ACCELERATOR" if forced else "predicted: its accelerator probe picks npu once torch_npu imports"
    home = _settings.raw("ASCEND_HOME_PATH")
    if ds["version"] and ds["detects"] == "npu" and not (home and os.path.isdir(home)):
        ds["warning"] = ("ASCEND_HOME_PATH is not an existing directory: DeepSpeed's NPU op builders and ds_report "
                         "read it unguarded (KeyError); set it, or DS_ACCELERATOR=cpu")
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


def collect():
    """Everything ``doctor`` prints, as a dict with a ``checks`` list."""
    checks = []

    def check(name, status, detail):
        checks.append({"check": name, "status": status, "detail": detail})

    import torch
    import torch_npu
    check("torch version", "ok" if torch.__version__.split("+")[0] == "2.13.0" else "fail",
          f"torch {torch.__version__} (torch_npu {torch_npu.__version__} needs 2.13.0)")
    entry_points = importlib.metadata.entry_points(group="torch.backends")
    autoload = any(ep.name == "torch_npu" for ep in entry_points)
    check("autoload entry point", "ok" if autoload else "warn",
          "import torch loads torch_npu" if autoload else "missing: scripts must import torch_npu themselves")
    available = torch.npu.is_available()
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
