"""Imports of CUDA-only libraries (never run: the libraries are not installed)."""
import torch
import triton  # expect: cuda-library
import triton.language as tl  # expect: cuda-library
from apex.normalization import FusedRMSNorm  # expect: cuda-library
from apex.optimizers import FusedAdam  # expect: cuda-library
from flash_attn import flash_attn_func  # expect: cuda-library
import bitsandbytes as bnb  # expect: cuda-library
from torch.utils.cpp_extension import CUDAExtension  # expect: cuda-library
from xformers.ops import memory_efficient_attention  # expect: cuda-library


@triton.jit
def add_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    pass


def attention(q, k, v):
    return flash_attn_func(q, k, v, causal=True)


def build():
    return CUDAExtension("my_ext", ["my_ext.cu"])
