"""Sign-bit packing: ``npu_sign_bits_pack`` packs the signs (x >= 0) of a float tensor into
uint8 bytes (8 per byte, padded), reshaped to ``(size, -1)``; ``npu_sign_bits_unpack`` turns the bits
back into +1 / -1 values of ``dtype``, shaped ``(size, -1)``.
"""
import torch
import torch.nn.functional as F

from torch_npu.op_plugin._common import check, unsupported
from torch_npu.op_plugin._registry import impl

__all__ = []


@impl("npu_sign_bits_pack")
def npu_sign_bits_pack(self, size):
    """Pack signs of a 1-D float16/float32 tensor, 1 bit per element, into uint8.

    Bit ``i`` (LSB first) of byte ``k`` is 1 when element ``8k + i`` is ``>= 0``; the
    input is padded to a multiple of 8 with zero bits. Result is ``(size, bytes / size)``.
    """
    op = "npu_sign_bits_pack"
    check(self.dim() == 1, op, "self must be 1-D")
    check(self.dtype in (torch.float16, torch.float32), op, "self must be float16 or float32")
    n = self.numel()
    nbytes = (n + 7) // 8
    check(size > 0 and nbytes % size == 0, op, "size=%d must divide the byte count %d", (size, nbytes))
    bits = (self >= 0).to(torch.int32)
    bits = F.pad(bits, (0, nbytes * 8 - n)).view(nbytes, 8)
    weights = (2 ** torch.arange(8, device=self.device, dtype=torch.int32))
    return (bits * weights).sum(-1).to(torch.uint8).view(size, nbytes // size)


@impl("npu_sign_bits_unpack")
def npu_sign_bits_unpack(input, size, dtype):
    """Unpack 1-D uint8 sign bits (LSB first) to ``+1`` (bit 1) / ``-1`` (bit 0) values of
    ``dtype`` (float16 or float32), shaped ``(size, 8 * numel / size)``."""
    op = "npu_sign_bits_unpack"
    check(input.dim() == 1 and input.dtype == torch.uint8, op, "input must be 1-D uint8")
    if dtype not in (torch.float16, torch.float32):
        unsupported(op, "dtype=%s (only float16/float32)" % (dtype,))
    n = input.numel() * 8
    check(size > 0 and n % size == 0, op, "size=%d must divide %d", (size, n))
    shifts = torch.arange(8, device=input.device, dtype=torch.int32)
    bits = (input.to(torch.int32)[:, None] >> shifts) & 1
    return (bits * 2 - 1).to(dtype).reshape(size, n // size)
