"""nn.SyncBatchNorm on npu over hccl equals BatchNorm over the whole batch."""
import subprocess
import sys
from pathlib import Path

import torch

from _subproc import make_env

WORKER = Path(__file__).parent / "dist_workers" / "syncbn.py"


def test_sync_batchnorm_matches_full_batch(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "torch_npu.distributed.run", "--nproc-per-node", "2",
                           "--standalone", str(WORKER), str(tmp_path)],
                          env=make_env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = [torch.load(tmp_path / f"rank{i}.pt") for i in range(2)]
    torch.manual_seed(0)
    x = torch.randn(8, 3, 5, 5).double().requires_grad_()
    bn = torch.nn.BatchNorm2d(3, momentum=0.3).double()
    with torch.no_grad():
        bn.weight.copy_(torch.tensor([1.5, 0.5, 2.0]))
        bn.bias.copy_(torch.tensor([0.1, -0.2, 0.3]))
    y = bn(x)
    (y * torch.arange(1.0, 6.0, dtype=torch.float64)).sum().backward()
    torch.testing.assert_close(torch.cat([r[0]["y"], r[1]["y"]]).double(), y.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.cat([r[0]["dx"], r[1]["dx"]]).double(), x.grad, rtol=1e-4, atol=1e-5)
    # weight / bias gradients stay local (DDP reduces them): their sum is the full-batch one
    torch.testing.assert_close((r[0]["dw"] + r[1]["dw"]).double(), bn.weight.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close((r[0]["db"] + r[1]["db"]).double(), bn.bias.grad, rtol=1e-4, atol=1e-5)
    for k in ("rm", "rv"):
        torch.testing.assert_close(r[0][k], r[1][k])
    torch.testing.assert_close(r[0]["rm"].double(), bn.running_mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(r[0]["rv"].double(), bn.running_var, rtol=1e-5, atol=1e-6)
