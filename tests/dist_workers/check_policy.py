"""Worker: how many collectives the fingerprint check covers (TORCH_NPU_EMU_COLLECTIVE_CHECK)."""
import json
import os
import sys

import torch
import torch.distributed as dist
import torch_npu

rank = int(os.environ["RANK"])
torch.npu.set_device(rank)
dist.init_process_group("hccl")
backend = dist.group.WORLD._get_backend(torch.device("npu"))
backend = getattr(backend, "wrapped_pg", backend)  # TORCH_DISTRIBUTED_DEBUG=DETAIL wraps it
counts = {}
x = torch.ones(1024, device="npu")            # 4 KiB: too big to ride in the check packet
for _ in range(40):
    dist.all_reduce(x)
counts["after_40_small"] = backend._fingerprint_count
big = torch.ones(9 << 20, device="npu")       # 36 MiB payload
dist.all_reduce(big)
counts["after_big"] = backend._fingerprint_count
counts["big_ok"] = bool((big.cpu() == 2).all())
counts["small_ok"] = bool((x.cpu() == 2 ** 40).all())
dist.destroy_process_group()
if rank == 0:
    with open(sys.argv[1], "w") as f:
        json.dump(counts, f)
