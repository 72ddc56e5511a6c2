"""Find where chip numerics change a training step, with Ascend's precision tool (msprobe).

msprobe (``pip install mindstudio-probe``) is what Ascend users run to dump
per-API statistics of a run on the NPU and compare them with a reference run.
This script does that on the emulated npu:

1. dumps one training step of a tiny conv + linear model twice, each in a
   fresh process, with msprobe's ``PrecisionDebugger`` (task ``statistics``,
   level ``L1``): once in exact numerics (bitwise the CPU) and once in chip
   numerics (``TORCH_NPU_EMU_NUMERICS=chip``: fp32 convolutions, and matmuls
   when ``torch.npu.matmul.allow_hf32`` is set, take HF32-rounded inputs as on
   the chip);
2. runs ``msprobe compare`` on the two dumps (the chip run as target, the exact
   run as golden);
3. reads msprobe's result table and names the APIs where the drift starts:
   their inputs match the reference run, their outputs do not.

The dumps record, per tensor, either a CRC32 of its bytes (``--summary-mode
md5``, the default here: a row matches when the bytes are equal) or
max/min/mean/L2 norm (``statistics``, msprobe's default: a row matches when
the four agree; they can agree for tensors that differ in a few last bits).

    python examples/msprobe_precision_compare.py --out /tmp/msprobe_run
    python examples/msprobe_precision_compare.py --target exact   # exact vs exact: nothing differs
"""
import argparse
import csv
import glob
import json
import os
import subprocess
import sys
import tempfile

NUMERICS = ("exact", "chip")
SUMMARY_MODES = ("md5", "statistics")
# msprobe's statistics columns: a row matches when all four differences are 0.
DIFF_COLUMNS = ("Max diff", "Min diff", "Mean diff", "L2norm diff")


def _model_and_batch():
    import torch
    import torch.nn.functional as F

    import torch_npu

    class TinyNet(torch.nn.Module):
        """A conv branch on an image and a linear branch on a vector (after torch_npu's
        RMSNorm), joined by a linear head."""

        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3)
            self.norm_weight = torch.nn.Parameter(torch.ones(8))
            self.fc = torch.nn.Linear(8, 6)
            self.head = torch.nn.Linear(4 * 6 * 6 + 6, 5)

        def forward(self, image, vector):
            a = F.relu(self.conv(image)).flatten(1)
            b = F.relu(self.fc(torch_npu.npu_rms_norm(vector, self.norm_weight)[0]))
            return self.head(torch.cat([a, b], 1))

    torch.manual_seed(0)
    model = TinyNet()
    g = torch.Generator().manual_seed(1)
    batch = (torch.randn(4, 3, 8, 8, generator=g), torch.randn(4, 8, generator=g), torch.randint(0, 5, (4,), generator=g))
    return model, batch


def dump_step(dump_dir, matmul_hf32=False, summary_mode="md5"):
    """Run one SGD step of TinyNet on npu under msprobe's PrecisionDebugger; return the dump.json path.

    The numerics mode is the process's (TORCH_NPU_EMU_NUMERICS), so call this in
    a fresh process per mode (``main`` does)."""
    import torch
    import torch.nn.functional as F

    import torch_npu  # noqa: F401
    from msprobe.pytorch import PrecisionDebugger

    torch.npu.matmul.allow_hf32 = matmul_hf32
    os.makedirs(dump_dir, exist_ok=True)
    config = {"task": "statistics", "dump_path": dump_dir, "rank": [], "step": [], "level": "L1",
              "statistics": {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": summary_mode}}
    config_path = os.path.join(dump_dir, "config.json")
    with open(config_path, "w") as f:
        json.dump(config, f)

    model, (image, vector, target) = _model_and_batch()
    model = model.npu()
    image, vector, target = image.npu(), vector.npu(), target.npu()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    debugger = PrecisionDebugger(config_path=config_path)
    debugger.start()
    loss = F.cross_entropy(model(image, vector), target)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    debugger.stop()
    debugger.step()
    return find_dump(dump_dir)


def find_dump(dump_dir):
    """The dump.json msprobe wrote for step 0 under ``dump_dir`` (one process: one file)."""
    found = glob.glob(os.path.join(dump_dir, "step0", "*", "dump.json"))
    if len(found) != 1:
        raise RuntimeError(f"msprobe wrote {len(found)} dump.json files under {dump_dir}/step0, expected 1")
    return found[0]


def run_dump(numerics, dump_dir, matmul_hf32=False, summary_mode="md5"):
    """``dump_step`` in a fresh process with TORCH_NPU_EMU_NUMERICS=numerics; return its dump.json path."""
    env = dict(os.environ, TORCH_NPU_EMU_NUMERICS=numerics)
    cmd = [sys.executable, os.path.abspath(__file__), "--dump-only", dump_dir, "--summary-mode", summary_mode]
    if matmul_hf32:
        cmd.append("--matmul-hf32")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"the {numerics} dump failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return find_dump(dump_dir)


def msprobe_compare(target_json, golden_json, out_dir):
    """Run ``msprobe compare -tp target -gp golden -o out_dir``; return the result csv's path."""
    msprobe = os.path.join(os.path.dirname(sys.executable), "msprobe")
    cmd = [msprobe] if os.path.exists(msprobe) else [sys.executable, "-m", "msprobe.msprobe"]
    proc = subprocess.run(cmd + ["compare", "-tp", target_json, "-gp", golden_json, "-o", out_dir],
                          capture_output=True, text=True, timeout=600)
    results = sorted(glob.glob(os.path.join(out_dir, "compare_result_*.csv")))
    if proc.returncode != 0 or not results:
        raise RuntimeError(f"msprobe compare failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return results[-1]


def row_matches(row):
    """Whether one row of msprobe's result table shows equal data in the two runs:
    equal CRC32s (md5 dumps) or four zero statistics differences (statistics dumps)."""
    if "NPU MD5" in row:
        return row["NPU MD5"] == row["BENCH MD5"]
    return all(row[c] in ("0", "0.0") for c in DIFF_COLUMNS)


def read_compare(csv_path):
    """msprobe's result rows grouped per API call: {api: {"input": [match...], "output": [match...]}}.

    An API call is a name like ``Functional.conv2d.0.forward``; its rows are
    ``...forward.input.0``, ``...forward.output.0`` and so on, each judged by
    ``row_matches``."""
    apis = {}
    with open(csv_path, newline="") as f:
        for row in csv.DictReader(f):
            name = row["NPU Name"]
            for part in (".input.", ".output.", ".parameters_grad."):
                if part in name:
                    api, kind = name.split(part)[0], part.strip(".")
                    break
            else:
                continue
            match = row_matches(row)
            entry = apis.setdefault(api, {"input": [], "output": [], "parameters_grad": []})
            entry[kind].append(match)
    return apis


def drift_origins(apis):
    """API calls whose inputs all match and whose outputs do not: where the difference starts."""
    return sorted(api for api, e in apis.items()
                  if all(e["input"]) and e["output"] and not all(e["output"]))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="directory for the dumps and the compare result "
                                                    "(default: a temporary directory)")
    parser.add_argument("--target", choices=NUMERICS, default="chip", help="numerics of the run under test")
    parser.add_argument("--matmul-hf32", action="store_true",
                        help="set torch.npu.matmul.allow_hf32 in both runs (chip mode then rounds matmul inputs)")
    parser.add_argument("--summary-mode", choices=SUMMARY_MODES, default="md5",
                        help="what msprobe records per tensor: md5 (CRC32 of the bytes) or statistics")
    parser.add_argument("--dump-only", metavar="DIR", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.dump_only:
        dump_step(args.dump_only, args.matmul_hf32, args.summary_mode)
        return None
    out = args.out or tempfile.mkdtemp(prefix="msprobe_compare_")
    golden = run_dump("exact", os.path.join(out, "exact"), args.matmul_hf32, args.summary_mode)
    target = run_dump(args.target, os.path.join(out, args.target + "_target"), args.matmul_hf32, args.summary_mode)
    result_csv = msprobe_compare(target, golden, os.path.join(out, "compare"))
    apis = read_compare(result_csv)
    origins = drift_origins(apis)
    matching = sorted(api for api, e in apis.items() if all(e["input"]) and all(e["output"]))
    print(f"msprobe compare result: {result_csv}")
    print(f"{len(apis)} API calls compared; {len(matching)} match the exact run entirely")
    print("drift starts at: " + (", ".join(origins) if origins else "nowhere (the runs agree)"))
    return {"csv": result_csv, "apis": apis, "origins": origins, "matching": matching}


if __name__ == "__main__":
    main()
