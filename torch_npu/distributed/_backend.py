"""Registration of the ``hccl`` c10d backend (ProcessGroupHCCL, emulated on Gloo).

ProcessGroupHCCL (C++) forwards every collective to a ProcessGroupGloo built
by PyTorch's own binding (this module's ``_make_gloo``). Before the Gloo mesh
connects, every rank checks that its peers agree on the group (world size,
unique ranks), so a mis-launched job fails within seconds instead of hanging.
"""
import json
import os
import socket
import time
import warnings
from datetime import timedelta

import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroupGloo

from torch_npu import _settings
from torch_npu._C._distributed_c10d import ProcessGroupHCCL, _set_gloo_factory

__all__ = []

# Real HCCL defaults (seconds).
_DEFAULT_CONNECT_TIMEOUT = 120
_init_generation = {}


def _env_seconds(name):
    """A HCCL_*_TIMEOUT in seconds, None when unset (parsed by torch_npu._settings)."""
    return _settings.get(name) if _settings.is_set(name) else None


def _check_settings():
    """The distributed settings are checked before any rank connects, and the
    C++ core gets their current values (TORCH_NPU_EMU_COLLECTIVE_CHECK...)."""
    _settings.validate("process group")
    _settings.push_to_core()


def _apply_socket_ifname():
    """HCCL_SOCKET_IFNAME names the NIC HCCL binds; Gloo reads GLOO_SOCKET_IFNAME."""
    ifname = _settings.get("HCCL_SOCKET_IFNAME")
    if not ifname or _settings.get("GLOO_SOCKET_IFNAME"):
        return
    if ifname.startswith("^"):
        warnings.warn(f"HCCL_SOCKET_IFNAME={ifname!r}: exclusion lists are not supported by the emulated "
                      "HCCL (Gloo); using the default interface")
        return
    names = [n.lstrip("=") for n in ifname.split(",") if n.strip()]
    os.environ["GLOO_SOCKET_IFNAME"] = ",".join(names)


def _make_gloo(store, rank, size, timeout):
    _apply_socket_ifname()
    return ProcessGroupGloo(store, rank, size, timeout)


def _check_peers(store, rank, size, group_id, timeout_s):
    """Every rank publishes what it believes about the group and checks its peers.

    Fails (on every rank that can tell) with a message naming the disagreement:
    two processes with the same rank, different world sizes, or ranks that never
    joined (dead, not started, or initialised another backend).
    """
    gen = _init_generation.get(group_id, 0)
    _init_generation[group_id] = gen + 1
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    prefix = f"hccl_init/{restart}/{gen}/"
    me = {"world_size": size, "host": socket.gethostname(), "pid": os.getpid()}
    if store.add(prefix + f"claim/{rank}", 1) > 1:
        store.set(prefix + "duplicate", str(rank))
        raise RuntimeError(
            f"HCCL init failed for group '{group_id}': rank {rank} is already taken by another process "
            f"({me['host']}, pid {me['pid']} is the second one). Every process of a job needs a unique "
            "RANK in [0, world_size).")
    store.set(prefix + f"info/{rank}", json.dumps(me))
    deadline = time.monotonic() + timeout_s
    pending = list(range(size))
    while pending:
        still = []
        for peer in pending:
            key = prefix + f"info/{peer}"
            if store.check([key]):
                info = json.loads(store.get(key))
                if info["world_size"] != size:
                    raise RuntimeError(
                        f"HCCL init failed for group '{group_id}': world size mismatch: this process "
                        f"(rank {rank}) has world_size={size}, rank {peer} ({info['host']}, pid {info['pid']}) "
                        f"has world_size={info['world_size']}. Launch every rank with the same world size "
                        "(check WORLD_SIZE / --nproc-per-node / --nnodes after a resume).")
            else:
                still.append(peer)
        if store.check([prefix + "duplicate"]):
            dup = store.get(prefix + "duplicate").decode()
            raise RuntimeError(f"HCCL init failed for group '{group_id}': two processes were started "
                               f"as rank {dup}; every process needs a unique RANK.")
        pending = still
        if pending:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"HCCL init failed for group '{group_id}': rank {rank} waited {timeout_s} s "
                    f"(HCCL_CONNECT_TIMEOUT) for ranks {pending} of world_size {size} to join the hccl "
                    "group. They have exited, are stuck, were launched with another world size, or "
                    "initialised a different backend.")
            time.sleep(0.02)


def _create_hccl(dist_backend_opts, pg_options):
    store = dist_backend_opts.store
    rank = dist_backend_opts.group_rank
    size = dist_backend_opts.group_size
    group_id = dist_backend_opts.group_id
    _check_settings()
    connect = _env_seconds("HCCL_CONNECT_TIMEOUT") or _DEFAULT_CONNECT_TIMEOUT
    _check_peers(store, rank, size, group_id, connect)
    if isinstance(pg_options, ProcessGroupHCCL.Options):
        options = pg_options
    else:
        options = ProcessGroupHCCL.Options()
        if pg_options is not None and hasattr(pg_options, "_timeout"):
            options._timeout = pg_options._timeout
    timeout = dist_backend_opts.timeout
    options._timeout = timeout if isinstance(timeout, timedelta) else timedelta(seconds=float(timeout))
    exec_timeout = _env_seconds("HCCL_EXEC_TIMEOUT")
    if exec_timeout is not None:
        # The collective timeout: a dead or hung peer makes the others raise by then.
        options._timeout = timedelta(seconds=exec_timeout)
    options.global_ranks_in_group = list(dist_backend_opts.global_ranks_in_group)
    options.group_id = group_id
    return ProcessGroupHCCL(store, rank, size, options)


def _bound_store_connect():
    """HCCL_CONNECT_TIMEOUT, when set, also bounds the env:// / tcp:// store rendezvous.

    Rank 0 otherwise waits for every peer to reach its TCPStore (and the others
    for rank 0) for the whole init_process_group timeout, 30 minutes by
    default: a rank that was never started would hang the job. Once the store
    is up it gets the group timeout back.
    """
    import sys
    import torch.distributed.rendezvous  # noqa: F401  (the attribute is the function; the module is in sys.modules)
    rendezvous = sys.modules["torch.distributed.rendezvous"]
    create = rendezvous._create_c10d_store

    def _create_c10d_store(hostname, port, rank, world_size, timeout, use_libuv=True):
        _check_settings()  # a bad HCCL_* value fails here, before the store connects
        connect = _env_seconds("HCCL_CONNECT_TIMEOUT")
        if connect is None or connect >= timeout.total_seconds():
            return create(hostname, port, rank, world_size, timeout, use_libuv)
        store = create(hostname, port, rank, world_size, timedelta(seconds=connect), use_libuv)
        store.set_timeout(timeout)
        return store

    rendezvous._create_c10d_store = _create_c10d_store


def register():
    if "hccl" in dist.Backend.backend_list:
        return
    _bound_store_connect()
    _set_gloo_factory(_make_gloo)
    dist.Backend.register_backend("hccl", _create_hccl, extended_api=True, devices=["npu"])
