"""A script already written for the NPU: `torch-npu migrate` must report nothing here.

It mentions cuda only in prose: "cuda" in this docstring, a comment, and printed text.
"""
import torch
import torch_npu  # noqa: F401

device = torch.device("npu:0")  # was "cuda:0" before the port
x = torch.ones(4, device=device).npu()
assert x.is_npu and torch.npu.is_available()
torch.npu.manual_seed(0)
backend = "hccl"
name = "cuda is what this script used to run on"
ckpt_name = "model_cuda.pt"
print(f"running on {device}; see docs about cuda:", x.sum().item())
