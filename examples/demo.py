"""`make demo`: a CUDA training script on two virtual Ascend NPUs, with the whole stack.

examples/llama_cuda/train.py is a small LLaMA-style decoder written for CUDA
(`.cuda()`, `nccl`, bf16 `torch.autocast("cuda")`, `torch.profiler`).  This
demo runs it unchanged with `TORCH_TRANSFER_TO_NPU=1 torch_npu_run
--nproc-per-node 2` (hccl DDP on npu:0 and npu:1), three times:

  1. train, save a checkpoint midway, and `kill -9` the job right after;
  2. resume from that checkpoint in a new job and finish;
  3. train again without interruption, profiling a few steps;

then shows that the resumed losses equal the uninterrupted ones bit for bit,
the CPU-fallback report, peak memory per card, a loss-curve PNG (matplotlib;
skipped with a message where it is not installed) and the profiler output.
`--size tiny` is the seconds-long version the tests run.
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TRAIN = os.path.join(HERE, "llama_cuda", "train.py")
WORKER = os.path.join(HERE, "demo_worker.py")
sys.path.insert(0, HERE)
from demo_plot import loss_curve_png  # noqa: E402

# size -> (total steps, checkpoint step); the model sizes are in train.py.
RUNS = {"small": (160, 80), "tiny": (40, 10)}
NPROC = 2


def launcher():
    """torch_npu_run from this interpreter's environment (the venv's console script)."""
    script = os.path.join(os.path.dirname(sys.executable), "torch_npu_run")
    return [script] if os.path.exists(script) else [sys.executable, "-m", "torch_npu.distributed.run"]


def parent_of(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def child_pids(parent):
    """Direct children of `parent`, from /proc (the launcher's workers)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if parent_of(entry) == parent:
                    pids.append(int(entry))
            except OSError:
                continue
    return pids


def processes_running(path):
    """Pids whose command line mentions `path` (this demo's output directory: its launchers and
    workers), leaving out this process and its ancestors (the shell or `timeout` that started it)."""
    ancestors, pid = set(), os.getpid()
    while pid > 1:
        ancestors.add(pid)
        try:
            pid = parent_of(pid)
        except OSError:
            break
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) not in ancestors:
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmdline = f.read().decode(errors="replace")
            except OSError:
                continue
            if path in cmdline:
                found.append(int(entry))
    return found


class Job:
    """One `torch_npu_run` job in its own session, so it can always be torn down whole."""

    def __init__(self, name, args, out, size):
        self.name, self.out = name, out
        self.run_dir = os.path.join(out, "runs", name)
        self.log = os.path.join(out, "logs", f"{name}.log")
        os.makedirs(os.path.dirname(self.log), exist_ok=True)
        env = dict(os.environ, TORCH_TRANSFER_TO_NPU="1", OMP_NUM_THREADS="1",
                   DEMO_FALLBACK_DIR=self.run_dir)
        cmd = launcher() + ["--standalone", f"--nproc-per-node={NPROC}", WORKER, TRAIN,
                            "--size", size, "--out-dir", self.run_dir] + args
        self.log_file = open(self.log, "w")
        # stdout (rank 0's progress bar) goes to the terminal; warnings and the launcher's log to the file.
        self.proc = subprocess.Popen(cmd, env=env, stdout=None, stderr=self.log_file, cwd=out,
                                     start_new_session=True)

    def wait(self, timeout):
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            self.log_file.close()

    def kill_workers(self):
        """SIGKILL every worker (each leads its own process group), as a crashed node would."""
        workers = child_pids(self.proc.pid)
        for pid in workers:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return workers

    def teardown(self):
        """Nothing of this job may outlive the demo."""
        if self.proc.poll() is None:
            self.kill_workers()
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        if not self.log_file.closed:
            self.log_file.close()

    def failed(self, what):
        with open(self.log, errors="replace") as f:
            tail = f.readlines()[-30:]
        sys.exit(f"{what} (exit code {self.proc.returncode}); last lines of {self.log}:\n" + "".join(tail))


def read_json(path):
    with open(path) as f:
        return json.load(f)


def hex_losses(run_dir):
    return {int(step): value for step, value in read_json(os.path.join(run_dir, "losses.json")).items()}


def section(title):
    print(f"\n== {title}", flush=True)


def run_interrupted(out, size, total, ckpt_step, jobs):
    section(f"1/3  train from scratch, save a checkpoint at step {ckpt_step}, then kill -9 the job")
    ckpt = os.path.join(out, "checkpoint.pt")
    job = Job("interrupted", ["--steps", str(total), "--save-at", str(ckpt_step), "--ckpt", ckpt], out, size)
    jobs.append(job)
    while job.proc.poll() is None and not os.path.exists(ckpt):
        time.sleep(0.01)
    killed = job.kill_workers() if job.proc.poll() is None else []
    code = job.wait(timeout=120)
    if not os.path.exists(ckpt):
        job.failed("the first run ended without writing its checkpoint")
    if killed:
        print(f"\n  checkpoint written -> SIGKILL to the workers (pids {', '.join(map(str, killed))}); "
              f"torch_npu_run reported the failure and exited with code {code}", flush=True)
    else:
        print(f"  the run finished before the kill signal (exit code {code}); resuming from its checkpoint")
    return ckpt, bool(killed)


def run_resumed(out, size, total, ckpt, jobs):
    section("2/3  a new job resumes from the checkpoint and finishes")
    job = Job("resumed", ["--steps", str(total), "--resume", ckpt], out, size)
    jobs.append(job)
    if job.wait(timeout=600) != 0:
        job.failed("the resumed run failed")
    return job.run_dir


def run_uninterrupted(out, size, total, jobs):
    section("3/3  the same training without interruption (the reference), profiling 2 steps on both cards")
    profile_dir = os.path.join(out, "profile")
    job = Job("uninterrupted", ["--steps", str(total), "--profile-dir", profile_dir], out, size)
    jobs.append(job)
    if job.wait(timeout=600) != 0:
        job.failed("the uninterrupted run failed")
    return job.run_dir, profile_dir


def loss_table(full, resumed, ckpt_step, total):
    """Prints selected rows; returns the steps where the resumed loss differs from the reference."""
    shown = sorted({1, ckpt_step, ckpt_step + 1, total} | set(range(0, total + 1, max(1, total // 8))) - {0})
    print(f"  {'step':>5}  {'uninterrupted':>13}  {'resumed':>13}  bitwise equal")
    for step in shown:
        ref = float.fromhex(full[step])
        if step in resumed:
            same = "yes" if resumed[step] == full[step] else "NO"
            print(f"  {step:5d}  {ref:13.6f}  {float.fromhex(resumed[step]):13.6f}  {same}")
        else:
            note = "  <- checkpoint, then kill -9" if step == ckpt_step else ""
            print(f"  {step:5d}  {ref:13.6f}  {'':>13}{note}")
    return [s for s in range(ckpt_step + 1, total + 1) if resumed.get(s) != full[s]]


def fallback_lines(run_dir):
    merged = {}
    for rank in range(NPROC):
        for row in read_json(os.path.join(run_dir, f"fallback_rank{rank}.json")):
            entry = merged.setdefault(row["op"], {"calls": 0, "bytes_to_cpu": 0, "bytes_to_npu": 0})
            for key in entry:
                entry[key] += row[key]
    if not merged:
        return ["  none: every op this model ran has an NPU kernel in torch_npu 2.13.0"]
    return [f"  {op:40s} {v['calls']:6d} calls  {v['bytes_to_cpu']:>10d} B to CPU  {v['bytes_to_npu']:>10d} B back"
            for op, v in sorted(merged.items(), key=lambda kv: -kv[1]["calls"])]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=sorted(RUNS), default="small")
    parser.add_argument("--out-dir", default=os.path.join(ROOT, "build", "demo"))
    args = parser.parse_args()
    out = os.path.abspath(args.out_dir)
    total, ckpt_step = RUNS[args.size]
    # Clear what a previous demo left here, and nothing else (--out-dir may be any directory).
    for name in ("runs", "logs", "profile"):
        shutil.rmtree(os.path.join(out, name), ignore_errors=True)
    for name in ("checkpoint.pt", "checkpoint.pt.tmp", "loss_curve.png"):
        if os.path.exists(os.path.join(out, name)):
            os.remove(os.path.join(out, name))
    os.makedirs(out, exist_ok=True)
    started = time.perf_counter()
    print(f"A LLaMA-style decoder written for CUDA (examples/llama_cuda/train.py), trained on {NPROC} virtual NPUs:")
    print(f"  TORCH_TRANSFER_TO_NPU=1 torch_npu_run --nproc-per-node {NPROC} ...  (nccl -> hccl, .cuda() -> npu,"
          f" autocast('cuda') -> npu, bf16)")
    print(f"  corpus: examples/llama_cuda/corpus.txt, {os.path.getsize(TRAIN.replace('train.py', 'corpus.txt'))}"
          f" characters; {total} steps, size '{args.size}'")

    jobs = []
    try:
        ckpt, killed = run_interrupted(out, args.size, total, ckpt_step, jobs)
        resumed_dir = run_resumed(out, args.size, total, ckpt, jobs)
        full_dir, profile_dir = run_uninterrupted(out, args.size, total, jobs)
    finally:
        for job in jobs:
            job.teardown()

    full, resumed = hex_losses(full_dir), hex_losses(resumed_dir)
    section("Losses (mean over the 2 ranks)")
    mismatches = loss_table(full, resumed, ckpt_step, total)
    if mismatches:
        print(f"  RESUME MISMATCH at steps {mismatches}")
    else:
        print(f"  all {total - ckpt_step} resumed losses equal the uninterrupted ones bit for bit "
              f"(compared as float.hex)")

    section("Ops that fell back to the CPU (torch_npu.emulator.fallback_report(), both ranks)")
    print("\n".join(fallback_lines(full_dir)))

    section("Peak device memory per card (torch.cuda.max_memory_allocated -> torch.npu)")
    for rank in range(NPROC):
        card = read_json(os.path.join(full_dir, f"rank{rank}.json"))
        print(f"  rank {rank} on {card['device']}: "
              f"{card['max_memory_allocated'] / 2**20:.2f} MiB allocated, "
              f"{card['max_memory_reserved'] / 2**20:.2f} MiB reserved")

    png = os.path.join(out, "loss_curve.png")
    skipped = loss_curve_png(png, {s: float.fromhex(v) for s, v in full.items()},
                             {s: float.fromhex(v) for s, v in resumed.items()}, ckpt_step)
    prof_runs = sorted(d for d in os.listdir(profile_dir) if d.endswith("_ascend_pt"))

    stray = processes_running(out)
    section("Where to look")
    print(f"  loss curve          {skipped or png}")
    print(f"  profiler output     {profile_dir}/  ({len(prof_runs)} x *_ascend_pt, one per rank)")
    for name in prof_runs:
        print(f"    summary           {os.path.join(profile_dir, name, 'ASCEND_PROFILER_OUTPUT', 'summary.txt')}")
    print(f"    timeline          open ASCEND_PROFILER_OUTPUT/trace_view.json in https://ui.perfetto.dev ;"
          f" or: tensorboard --logdir {profile_dir}")
    print(f"  checkpoint          {ckpt}")
    print(f"  logs (stderr)       {os.path.join(out, 'logs')}/")
    print(f"  the training script {os.path.relpath(TRAIN, os.getcwd())}")
    print(f"\n{time.perf_counter() - started:.0f} s; stray processes: "
          f"{'none' if not stray else ', '.join(map(str, stray))}")
    if mismatches or stray:
        sys.exit(1)


if __name__ == "__main__":
    main()
