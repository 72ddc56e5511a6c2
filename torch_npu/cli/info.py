"""``torch-npu info``: print the emulated machine."""
import json

import click


@click.command()
def info():
    """Print the emulated machine (devices, memory, versions) as JSON."""
    import torch
    import torch_npu
    cfg = torch_npu.emulator.config()
    out = {
        "torch": torch.__version__,
        "torch_npu": torch_npu.__version__,
        "cann (emulated)": torch_npu.emulator.cann_version(),
        "device_name": cfg["device_name"],
        "device_count": cfg["device_count"],
        "physical_device_count": cfg["physical_device_count"],
        "memory_per_device_bytes": cfg["memory_per_device"],
        "visible_devices": cfg["visible_devices"],
    }
    click.echo(json.dumps(out, indent=2))
    return 0
