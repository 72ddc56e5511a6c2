"""``torch-npu``: command-line tool of the emulated torch_npu.

Sub-commands:
  info    print the emulated machine (devices, memory, versions)
"""
import argparse
import json


def _info(_args):
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
    print(json.dumps(out, indent=2))
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(prog="torch-npu", description="Emulated torch_npu command-line tool")
    sub = parser.add_subparsers(dest="cmd")
    p = sub.add_parser("info", help="print the emulated machine")
    p.set_defaults(fn=_info)
    args = parser.parse_args(argv)
    if not hasattr(args, "fn"):
        parser.print_help()
        return 0
    return args.fn(args)


if __name__ == "__main__":
    raise SystemExit(main())
