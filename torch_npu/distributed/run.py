"""``torch_npu_run``: torchrun for NPU jobs.

Same flags and behaviour as ``torchrun`` (``torch.distributed.run``): every
worker gets ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` … and
inherits ``ASCEND_RT_VISIBLE_DEVICES``, so ``torch.npu.set_device(local_rank)``
picks the worker's own card. ``--nproc-per-node=npu`` (or ``auto``) launches
one worker per visible NPU.

What it adds, so that elastic restarts (``--max-restarts``) work:

* ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (unless set): with a c10d
  rendezvous, every restart round gets a fresh worker store. With the shared
  agent store, the keys a failed attempt left behind (each rank's Gloo
  address) are read by the next attempt, which then connects to a dead
  process and fails at random.
* a single-node launch with restarts and the static rendezvous (an explicit
  ``--master-port``) uses the c10d rendezvous on a free local port instead,
  as torchrun itself does when no master port is given; the static store
  would survive restarts with the same stale keys. A multi-node static launch
  with restarts is left alone, with a warning: switching it would change how
  node ranks are assigned.

torch_npu's ``--enable-tiered-parallel-tcpstore`` is accepted; the emulator
has no proxy store tier, so it has no effect.
"""
import os

from torch.distributed import run as _torchrun
from torch.distributed.argparse_util import env
from torch.distributed.elastic.multiprocessing.errors import record
from torch.distributed.elastic.utils.logging import get_logger

__all__ = ["parse_args"]

logger = get_logger(__name__)

# Read by torch's DynamicRendezvousHandler when each round completes.
_FRESH_STORE_ENV = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


def parse_args(args):
    """torchrun's arguments plus torch_npu's ``--enable-tiered-parallel-tcpstore``."""
    parser = _torchrun.get_args_parser()
    parser.add_argument(
        "--enable-tiered-parallel-tcpstore",
        "--enable_tiered_parallel_tcpstore",
        action=env,
        type=str,
        default="false",
        help="torch_npu's proxy tier for the rendezvous store (accepted; no effect on the emulated NPU).",
    )
    return parser.parse_args(args)


def _prepare(args, environ):
    """Adjust parsed arguments and the launcher environment so restarts work.

    Returns the list of changes made (for logging and tests).
    """
    changes = []
    if args.rdzv_backend == "parallel":
        # torch_npu's own rendezvous: a static one (master address/port,
        # node ranks) over its ParallelStore; here PyTorch's static store.
        args.rdzv_backend = "static"
        changes.append("rdzv_backend parallel -> static")
    _, max_nodes = _torchrun.parse_min_max_nnodes(args.nnodes)
    restarts = args.max_restarts > 0
    if restarts and not args.standalone and args.rdzv_backend == "static":
        if max_nodes == 1:
            args.rdzv_backend = "c10d"
            args.rdzv_endpoint = "localhost:0"
            changes.append("rdzv_backend static -> c10d on localhost:0 (restarts need a fresh store per round)")
        else:
            logger.warning(
                "torch_npu_run: --max-restarts=%d with the static rendezvous on %d nodes: a restarted "
                "worker group reuses the agents' store, whose keys from the failed attempt can make the "
                "next init fail. Use --rdzv-backend=c10d --rdzv-endpoint=HOST:PORT for elastic restarts.",
                args.max_restarts, max_nodes)
    if _FRESH_STORE_ENV not in environ:
        environ[_FRESH_STORE_ENV] = "1"
        changes.append(f"{_FRESH_STORE_ENV}=1")
    if str(args.enable_tiered_parallel_tcpstore).lower() == "true":
        logger.warning("torch_npu_run: --enable-tiered-parallel-tcpstore has no effect on the emulated NPU")
    return changes


@record
def _main(args=None):
    args = parse_args(args)
    for change in _prepare(args, os.environ):
        logger.info("torch_npu_run: %s", change)
    _torchrun.run(args)


if __name__ == "__main__":
    _main()
