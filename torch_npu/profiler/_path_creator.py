"""The output directory name, as torch_npu names it:
``<dir>/<worker>_<YYYYmmddHHMMSSmmm>_ascend_pt``, worker defaulting to
``<hostname>_<pid>`` and dir to ``$ASCEND_WORK_PATH/profiling_data`` or the cwd."""
import datetime
import os
import socket

MAX_WORKER_NAME_LENGTH = 226


def valid_worker_name(worker_name):
    if worker_name is None:
        return None
    if isinstance(worker_name, str) and worker_name and len(worker_name) < MAX_WORKER_NAME_LENGTH:
        return worker_name
    print("[WARNING] Invalid parameter worker_name, reset it to default.")
    return None


def valid_dir_name(dir_name):
    if dir_name is None or (isinstance(dir_name, str) and dir_name):
        return dir_name
    print("[WARNING] Invalid parameter dir_name, reset it to default.")
    return None


def base_dir(dir_name) -> str:
    if dir_name:
        return os.path.abspath(dir_name)
    from torch_npu import _settings
    work = _settings.get("ASCEND_WORK_PATH")
    if work:
        return os.path.join(os.path.abspath(work), "profiling_data")
    return os.getcwd()


def create_prof_dir(dir_name=None, worker_name=None) -> str:
    worker = worker_name or f"{socket.gethostname()}_{os.getpid()}"
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d%H%M%S%f")[:-3]
    path = os.path.join(base_dir(dir_name), f"{worker}_{stamp}_ascend_pt")
    suffix = 1
    unique = path
    while os.path.exists(unique):   # two traces in the same millisecond
        unique = f"{path[:-len('_ascend_pt')]}{suffix}_ascend_pt"
        suffix += 1
    os.makedirs(unique, mode=0o750)
    return unique
