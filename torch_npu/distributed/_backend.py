"""Registration of the ``hccl`` c10d backend (ProcessGroupHCCL, emulated on Gloo).

ProcessGroupHCCL (C++) forwards every collective to a ProcessGroupGloo built
by PyTorch's own binding (this module's ``_make_gloo``). Before the Gloo mesh
connects, every rank checks that its peers agree on the group (world size,
unique ranks, valid HCCL_* settings), so a mis-launched job fails within
seconds instead of hanging, and every rank raises the same DistBackendError
(see ``_check_peers``).
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


def _who(rank, info):
    return f"rank {rank} ({info['host']}, pid {info['pid']})"


# How long group rank 0 stays after the last acknowledgement: it may host the env:// store,
# and a peer's last look at the acknowledgement count must not find it gone.
_HOST_LINGER_S = 0.3


def _fail_together(store, prefix, group_id, rank, message, expected, deadline):
    """Raise the group's verdict on this rank, after every process that joined has read it.

    The first rank to find a fault publishes its message (and how many processes must read
    it: ``expected``) as the verdict; every rank raises the verdict's text, so all of them
    report the same fault the same way. A rank leaves only when that many processes, and
    all that joined, have acknowledged the verdict, or at ``deadline`` (at least one second
    from now): the store may live in group rank 0 (it hosts the env:// TCPStore), and
    leaving early would turn its peers' clear error into a lost connection. Once a rank
    has seen the count complete it does not touch the store again.
    """
    verdict = {"text": f"HCCL init failed for group '{group_id}': {message}", "expected": expected}
    deadline = max(deadline, time.monotonic() + 1.0)
    try:
        if store.add(prefix + "verdict_claim", 1) == 1:
            store.set(prefix + "verdict", json.dumps(verdict))
        while not store.check([prefix + "verdict"]) and time.monotonic() < deadline:
            time.sleep(0.005)  # the first finder is writing it
        if store.check([prefix + "verdict"]):
            verdict = json.loads(store.get(prefix + "verdict"))
        joined = store.add(prefix + "joined", 0)
        acked = store.add(prefix + "acked", 1)
        while acked < max(joined, verdict["expected"]) and time.monotonic() < deadline:
            time.sleep(0.01)
            joined, acked = store.add(prefix + "joined", 0), store.add(prefix + "acked", 0)
        if rank == 0:
            time.sleep(_HOST_LINGER_S)
    except dist.DistError:
        pass  # the store's host has gone after everyone read the verdict: nothing more to wait for
    raise dist.DistBackendError(verdict["text"])


def _check_peers(store, rank, size, group_id, timeout_s, settings_error=None, backend="hccl"):
    """Every rank publishes what it believes about the group and checks its peers.

    Faults, each reported by every rank with the same DistBackendError text (the verdict
    of ``_fail_together``): two processes with the same rank, different world sizes, an
    invalid HCCL_* setting on some rank (``settings_error``: that rank still takes part,
    so its peers learn why instead of waiting), ranks on different backends (``backend``:
    a ``gloo`` default group takes part through ``_check_gloo_peers``), or ranks that did
    not join within ``timeout_s`` (HCCL_CONNECT_TIMEOUT: dead, not started, or on a backend
    that does not take part). Returns ``False`` when a ``gloo`` rank's wait ran out (its
    peers may be processes without torch_npu): Gloo's own rendezvous then goes on.
    """
    # Counted per (group, rank): ranks run as threads of one process keep their own count.
    gen = _init_generation.get((group_id, rank), 0)
    _init_generation[(group_id, rank)] = gen + 1
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    prefix = f"hccl_init/{restart}/{gen}/"
    deadline = time.monotonic() + timeout_s
    me = {"world_size": size, "host": socket.gethostname(), "pid": os.getpid(), "settings_error": settings_error,
          "backend": backend}
    store.add(prefix + "joined", 1)

    def fail(message, expected=size):
        _fail_together(store, prefix, group_id, rank, message, expected, deadline)

    if store.add(prefix + f"claim/{rank}", 1) > 1:
        fail(f"rank {rank} is already taken: two processes were started as rank {rank} (the second one is "
             f"{me['host']}, pid {me['pid']}). Every process of a job needs a unique RANK in [0, world_size).",
             expected=min(size, store.add(prefix + "joined", 0)))
    store.set(prefix + f"info/{rank}", json.dumps(me))
    if settings_error is not None:
        fail(f"{_who(rank, me)} has an invalid setting: {settings_error}. Fix it on that rank.")
    pending, known = list(range(size)), {rank: me}
    while pending:
        if store.check([prefix + "verdict"]):
            fail("another rank found a fault", expected=0)  # the published verdict is what is raised
        still = []
        for peer in pending:
            key = prefix + f"info/{peer}"
            if peer not in known and not store.check([key]):
                still.append(peer)
                continue
            info = known.setdefault(peer, json.loads(store.get(key)))
            if info.get("settings_error"):
                fail(f"{_who(peer, info)} has an invalid setting: {info['settings_error']}. Fix it on that rank.")
            if info.get("backend", "hccl") != backend:
                fail(f"backend mismatch: {_who(rank, me)} initialised '{backend}', {_who(peer, info)} initialised "
                     f"'{info['backend']}'. Pass the same backend to init_process_group on every rank.")
            if info["world_size"] != size:
                fail(f"world size mismatch: {_who(rank, me)} has world_size={size}, {_who(peer, info)} has "
                     f"world_size={info['world_size']}. Launch every rank with the same world size "
                     "(check WORLD_SIZE / --nproc-per-node / --nnodes after a resume).",
                     expected=min(size, info["world_size"]))
        pending = still
        if pending:
            if time.monotonic() > deadline and backend != "hccl":
                return False
            if time.monotonic() > deadline:
                fail(f"rank {rank} waited {timeout_s} s (HCCL_CONNECT_TIMEOUT) for ranks {pending} of world_size "
                     f"{size} to join the hccl group. They have exited, are stuck, were launched with another "
                     "world size, or initialised a different backend.",
                     expected=size - len(pending))
            time.sleep(0.02)


def _check_gloo_peers():
    """Make a ``gloo`` default group take part in the hccl start-up check.

    A job whose ranks disagree on the backend (``init_process_group("hccl")`` on some,
    ``"gloo"`` on others) would leave the gloo ranks waiting in Gloo's rendezvous while the
    hccl ranks fail alone. Here a gloo default group first publishes its view in the same
    place as the hccl ranks, under the same ``{group_name}/npu/`` store prefix, so every rank
    raises the same backend-mismatch DistBackendError at once. Its wait is bounded by
    HCCL_CONNECT_TIMEOUT (120 s by default) and, when that runs out, Gloo's own rendezvous
    goes on as before: a peer without torch_npu costs that much delay, never a failure.
    """
    c10d = dist.distributed_c10d
    helper = c10d._new_process_group_helper
    if getattr(helper, "_torch_npu_gloo_check", False):
        return

    def _new_process_group_helper(group_size, group_rank, global_ranks_in_group, backend, store, group_name,
                                  *args, **kwargs):
        if kwargs.get("group_desc") == "default_pg" and str(backend) == dist.Backend.GLOO and group_size > 1:
            try:
                connect = _env_seconds("HCCL_CONNECT_TIMEOUT") or _DEFAULT_CONNECT_TIMEOUT
            except ValueError:
                connect = _DEFAULT_CONNECT_TIMEOUT  # an hccl peer reports the bad value itself
            timeout = kwargs.get("timeout")
            if isinstance(timeout, timedelta):
                connect = min(connect, timeout.total_seconds())
            peers_store = c10d.PrefixStore("npu/", c10d.PrefixStore(f"{group_name}/", store))
            _check_peers(peers_store, group_rank, group_size, group_name, connect, backend="gloo")
        return helper(group_size, group_rank, global_ranks_in_group, backend, store, group_name, *args, **kwargs)

    _new_process_group_helper._torch_npu_gloo_check = True
    c10d._new_process_group_helper = _new_process_group_helper


def _create_hccl(dist_backend_opts, pg_options):
    store = dist_backend_opts.store
    rank = dist_backend_opts.group_rank
    size = dist_backend_opts.group_size
    group_id = dist_backend_opts.group_id
    # A bad value is parsed here, before any collective, but reported to every rank by the
    # peer check rather than raised at once: a rank that left now would leave its peers
    # waiting, or without their store.
    settings_error, connect, exec_timeout = None, _DEFAULT_CONNECT_TIMEOUT, None
    try:
        _check_settings()
        connect = _env_seconds("HCCL_CONNECT_TIMEOUT") or _DEFAULT_CONNECT_TIMEOUT
        exec_timeout = _env_seconds("HCCL_EXEC_TIMEOUT")
    except ValueError as e:
        settings_error = str(e)
        try:
            connect = _env_seconds("HCCL_CONNECT_TIMEOUT") or _DEFAULT_CONNECT_TIMEOUT
        except ValueError:
            pass
    _check_peers(store, rank, size, group_id, connect, settings_error)
    if isinstance(pg_options, ProcessGroupHCCL.Options):
        options = pg_options
    else:
        options = ProcessGroupHCCL.Options()
        if pg_options is not None and hasattr(pg_options, "_timeout"):
            options._timeout = pg_options._timeout
    timeout = dist_backend_opts.timeout
    options._timeout = timeout if isinstance(timeout, timedelta) else timedelta(seconds=float(timeout))
    if exec_timeout is not None:
        # The collective timeout: a dead or hung peer makes the others raise by then.
        options._timeout = timedelta(seconds=exec_timeout)
    options.global_ranks_in_group = list(dist_backend_opts.global_ranks_in_group)
    options.group_id = group_id
    return ProcessGroupHCCL(store, rank, size, options)


def _bound_store_connect():
    """The env:// / tcp:// store rendezvous, made to fail the same way on every rank.

    Rank 0 hosts the TCPStore. PyTorch makes it wait there until ``world_size`` processes
    have connected, for the whole init_process_group timeout (30 minutes by default); a
    rank 0 launched with a larger world size than its peers, or whose peer was never
    started, would leave the others with a lost connection when it gives up. Here rank 0
    does not wait in the store: the peer check of ``_check_peers`` does, bounded by
    HCCL_CONNECT_TIMEOUT, and tells every rank what is wrong. HCCL_CONNECT_TIMEOUT, when
    set, also bounds how long the other ranks try to reach rank 0's store; once connected
    they get the group timeout back.
    """
    import sys
    import torch.distributed.rendezvous  # noqa: F401  (the attribute is the function; the module is in sys.modules)
    rendezvous = sys.modules["torch.distributed.rendezvous"]
    create = rendezvous._create_c10d_store

    def _create_c10d_store(hostname, port, rank, world_size, timeout, use_libuv=True):
        if rank == 0 and not rendezvous._torchelastic_use_agent_store():
            if not 0 <= port < 2**16:
                raise ValueError(f"port must have value from 0 to 65535 but was {port}.")
            return dist.TCPStore(host_name=hostname, port=port, world_size=world_size, is_master=True,
                                 timeout=timeout, wait_for_workers=False, multi_tenant=True, use_libuv=use_libuv)
        try:
            connect = _env_seconds("HCCL_CONNECT_TIMEOUT")
        except ValueError:
            connect = None  # reported to every rank by the peer check, once the store is up
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
    _check_gloo_peers()
    _set_gloo_factory(_make_gloo)
    dist.Backend.register_backend("hccl", _create_hccl, extended_api=True, devices=["npu"])
