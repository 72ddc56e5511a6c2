"""save_async never loses a checkpoint silently.

A failed background write (missing directory, read-only file system, full disk)
raises a RuntimeError naming the file and the cause at the next save_async call,
at the explicit wait, or, if nobody was told, at interpreter exit with exit
status 1. The previous checkpoint at the path is never touched and the
temporary file of the failed write is removed. (A SIGKILL during the write is
covered by test_checkpoint_safety.py: the previous file stays loadable and the
temporary file ``.<name>.tmp-<pid>-<n>`` is left behind, safe to delete.)

The read-only and full-disk cases use real tmpfs mounts (the tests run as root,
which ignores permission bits); where mounting is not permitted the same
OSError is injected at the file-write layer instead.
"""
import errno
import io
import os
import subprocess
import sys
import textwrap
import threading

import pytest
import torch

import torch_npu
from torch_npu.utils import _save_async
from torch_npu.utils._save_async import _wait_for_pending_saves

from _subproc import REPO, make_env


def _join_writer():
    """Let the background write finish without collecting its outcome."""
    _save_async._wait_quietly()


@pytest.fixture(autouse=True)
def _no_leftover_failures():
    yield
    with _save_async._writer_lock:
        left = _save_async._failures[:]
        _save_async._failures.clear()
    assert not left, f"a test left unreported save_async failures: {left}"


def _mount_tmpfs(path, options):
    path.mkdir(exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True)
    return r.returncode == 0


def _umount(path):
    subprocess.run(["umount", str(path)], capture_output=True)


class _FailingFile:
    def __init__(self, err):
        self.err = err

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def write(self, data):
        raise OSError(self.err, os.strerror(self.err))


def _inject(monkeypatch, err):
    """Fallback when mounting is not permitted: creating the temporary file raises ``err``."""
    def failing_open(path, mode="r", *args, **kwargs):
        if "w" in mode and ".tmp-" in os.path.basename(path):
            if err == errno.ENOSPC:
                with open(path, mode, *args, **kwargs):
                    pass  # created, then the write fails: the temp file must be cleaned up
                return _FailingFile(err)
            raise OSError(err, os.strerror(err), path)
        return open(path, mode, *args, **kwargs)
    monkeypatch.setattr(_save_async, "open", failing_open, raising=False)


@pytest.fixture
def read_only_dir(tmp_path, monkeypatch):
    """A directory holding ``ckpt.pt`` (step 1) whose file system is read-only."""
    mnt = tmp_path / "ro"
    mounted = _mount_tmpfs(mnt, "size=4m")
    torch.save({"step": 1}, mnt / "ckpt.pt")
    if mounted:
        assert subprocess.run(["mount", "-o", "remount,ro", str(mnt)]).returncode == 0
    else:
        _inject(monkeypatch, errno.EROFS)
    yield mnt, "Read-only file system"
    if mounted:
        _umount(mnt)


@pytest.fixture
def full_disk_dir(tmp_path, monkeypatch):
    """A 64 KiB file system holding a small ``ckpt.pt`` (step 1)."""
    mnt = tmp_path / "small"
    mounted = _mount_tmpfs(mnt, "size=64k")
    torch.save({"step": 1}, mnt / "ckpt.pt")
    if not mounted:
        _inject(monkeypatch, errno.ENOSPC)
    yield mnt, "No space left on device"
    if mounted:
        _umount(mnt)


def _big():
    return {"step": 2, "w": torch.ones(64 * 1024).npu()}  # 256 KiB: more than the 64 KiB disk


def test_missing_directory_raises_at_the_wait_naming_file_and_cause(tmp_path):
    target = tmp_path / "no_such_dir" / "ckpt.pt"
    torch_npu.utils.save_async({"step": 1}, target)
    with pytest.raises(RuntimeError) as info:
        _wait_for_pending_saves()
    msg = str(info.value)
    assert f"the checkpoint '{target}' was NOT saved" in msg
    assert "FileNotFoundError" in msg
    assert isinstance(info.value.__cause__, FileNotFoundError)
    _wait_for_pending_saves()  # reported once: the next wait is clean
    assert not (tmp_path / "no_such_dir").exists()


def test_failure_raises_at_the_next_save_async_call_which_does_not_start(tmp_path):
    target = tmp_path / "missing" / "ckpt.pt"
    good = tmp_path / "good.pt"
    torch_npu.utils.save_async({"step": 1}, target)
    _join_writer()
    with pytest.raises(RuntimeError, match=r"the checkpoint '.*missing/ckpt\.pt' was NOT saved.*FileNotFoundError"):
        torch_npu.utils.save_async({"step": 2}, good)
    _wait_for_pending_saves()
    assert not good.exists()  # the call raised before starting its own write
    torch_npu.utils.save_async({"step": 3}, good)  # reported: saving works again
    _wait_for_pending_saves()
    assert torch.load(good)["step"] == 3


class _SlowFile(io.BytesIO):
    """A file object whose first write waits until ``release`` is set (a slow disk)."""

    def __init__(self):
        super().__init__()
        self.release = threading.Event()

    def write(self, data):
        assert self.release.wait(60)
        return super().write(data)


def test_failures_queued_behind_a_slow_write_are_all_named(tmp_path):
    slow = _SlowFile()
    torch_npu.utils.save_async({"step": 0}, slow)
    for i in range(3):  # queued behind the slow write: none has failed yet, so no call raises
        torch_npu.utils.save_async({"step": i}, tmp_path / f"gone{i}" / "ckpt.pt")
    slow.release.set()
    with pytest.raises(RuntimeError) as info:
        _wait_for_pending_saves()
    msg = str(info.value)
    assert all(f"gone{i}" in msg for i in range(3)) and "2 more save(s) failed too" in msg
    slow.seek(0)
    assert torch.load(slow)["step"] == 0


def test_read_only_directory_keeps_previous_checkpoint(read_only_dir):
    mnt, cause = read_only_dir
    torch_npu.utils.save_async({"step": 2}, mnt / "ckpt.pt")
    with pytest.raises(RuntimeError) as info:
        _wait_for_pending_saves()
    assert f"'{mnt / 'ckpt.pt'}' was NOT saved" in str(info.value) and cause in str(info.value)
    assert info.value.__cause__.errno == errno.EROFS
    assert torch.load(mnt / "ckpt.pt")["step"] == 1
    assert sorted(p.name for p in mnt.iterdir()) == ["ckpt.pt"]


def test_full_disk_keeps_previous_checkpoint_and_removes_the_temp_file(full_disk_dir):
    mnt, cause = full_disk_dir
    torch_npu.utils.save_async(_big(), mnt / "ckpt.pt")
    with pytest.raises(RuntimeError) as info:
        _wait_for_pending_saves()
    assert f"'{mnt / 'ckpt.pt'}' was NOT saved" in str(info.value) and cause in str(info.value)
    assert info.value.__cause__.errno == errno.ENOSPC
    assert torch.load(mnt / "ckpt.pt")["step"] == 1
    assert sorted(p.name for p in mnt.iterdir()) == ["ckpt.pt"]  # no temporary file left


_EXIT_SCRIPT = textwrap.dedent("""
    import atexit, sys, torch, torch_npu
    from torch_npu.utils._save_async import _wait_for_pending_saves
    atexit.register(lambda: print("user atexit handler ran", flush=True))
    mode, target = sys.argv[1], sys.argv[2]
    torch_npu.utils.save_async({"step": 1}, target)
    if mode == "caught":
        try:
            _wait_for_pending_saves()
        except RuntimeError as e:
            print("caught:", type(e.__cause__).__name__, flush=True)
    print("training done", flush=True)
""")


@pytest.mark.parametrize("mode,bad,status", [("unwaited", True, 1), ("caught", True, 0), ("unwaited", False, 0)])
def test_exit_status_reports_a_save_nobody_was_told_about(tmp_path, mode, bad, status):
    target = tmp_path / ("missing" if bad else ".") / "ckpt.pt"
    r = subprocess.run([sys.executable, "-c", _EXIT_SCRIPT, mode, str(target)], cwd=str(REPO), env=make_env(),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == status, r.stderr[-3000:]
    assert "training done" in r.stdout and "user atexit handler ran" in r.stdout
    lost = f"the checkpoint '{target}' was NOT saved: writing it failed with FileNotFoundError"
    if mode == "unwaited" and bad:
        assert lost in r.stderr and "Exiting with status 1." in r.stderr
    else:
        assert lost not in r.stderr, r.stderr[-3000:]
    if not bad:
        assert torch.load(target)["step"] == 1
