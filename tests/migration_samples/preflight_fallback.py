"""An NPU training loop with a planted CPU-fallback op (fmax into an out= buffer) and a fused op."""
import torch
import torch_npu

torch.manual_seed(0)
model = torch.nn.Linear(256, 256).npu()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
gamma = torch.ones(256, device="npu")
buf = torch.empty(64, 256, device="npu")
staging = torch.empty(16 * 2**20, device="npu:1")  # exactly 64 MiB on the second device
for step in range(100000):  # runs until preflight stops it
    x = torch.randn(64, 256, device="npu")
    h = model(x)
    # aten::fmax.out has no NPU kernel: it falls back to the CPU on hardware.
    torch.fmax(h.detach(), torch.zeros_like(h), out=buf)
    y, _ = torch_npu.npu_rms_norm(h + buf, gamma, 1e-6)
    loss = y.pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.6f}")
