"""How long ``torch-npu migrate`` takes on a repository of CUDA-heavy files.

Writes N files of about 300 lines each (the training scripts of ``tests/migrate_corpus``,
concatenated: every file is full of ``.cuda()``, ``torch.cuda.*``, device strings, AMP and
DataParallel) into a scratch directory, then times the whole command, as a user runs it, on
one file and on all of them, median of a few runs, wall clock and CPU time of the child.

    python bench/migrate_bench.py [--files 200] [--lines 300] [--reps 3]
"""
import argparse
import os
import pathlib
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parent.parent


def _write_corpus(directory, files, lines):
    sources = [p.read_text() for p in sorted((REPO / "tests" / "migrate_corpus").glob("*.py"))]
    for i in range(files):
        text, k = "", i
        while text.count("\n") < lines:
            text += sources[k % len(sources)] + "\n"
            k += 1
        (directory / f"train_{i:03d}.py").write_text(text)


def _time_command(args, reps):
    """Median wall seconds and median child CPU seconds of running ``args``; its last output line."""
    walls, cpus, last = [], [], ""
    for _ in range(reps):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        proc = subprocess.run(args, capture_output=True, text=True, timeout=600)
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        if proc.returncode not in (0, 1):
            raise SystemExit(f"{' '.join(args)} exited {proc.returncode}:\n{proc.stderr[-2000:]}")
        last = proc.stdout.strip().splitlines()[-1]
    return statistics.median(walls), statistics.median(cpus), last


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=200)
    parser.add_argument("--lines", type=int, default=300)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    cli = shutil.which("torch-npu", path=os.path.dirname(sys.executable)) or shutil.which("torch-npu")
    command = [cli] if cli else [sys.executable, str(REPO / "torch_npu_cli.py")]
    directory = pathlib.Path(tempfile.mkdtemp(prefix="migrate_bench_"))
    try:
        _write_corpus(directory, args.files, args.lines)
        one = sorted(directory.iterdir())[0]
        print(f"# torch-npu migrate: {args.files} files of ~{args.lines} lines (tests/migrate_corpus scripts), "
              f"median of {args.reps}, {os.cpu_count()} CPUs\n")
        print("| run | wall s | CPU s | report |\n|---|---:|---:|---|")
        for label, target in (("--help", ["--help"]), ("one file", ["migrate", str(one)]),
                              (f"{args.files} files", ["migrate", str(directory)])):
            wall, cpu, last = _time_command(command + target, args.reps)
            print(f"| {label} | {wall:.2f} | {cpu:.2f} | {last[:70]} |")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
