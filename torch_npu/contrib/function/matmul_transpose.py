"""``a @ b.transpose(-2, -1)`` with a hand-written backward on npu_bmmV2 (BERT attention scores)."""
import torch

import torch_npu

__all__ = ["matmul_transpose"]


class MatmulApply(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor1, tensor2):
        ctx.save_for_backward(tensor1, tensor2)
        return torch.matmul(tensor1, tensor2.transpose(-2, -1)).detach()

    @staticmethod
    def backward(ctx, grad):
        tensor1, tensor2 = ctx.saved_tensors
        # d(a b^T)/da = g b ; d(a b^T)/db = g^T a
        grad1 = torch_npu.npu_bmmV2(grad, tensor2, [])
        grad2 = torch_npu.npu_bmmV2(grad.transpose(-2, -1), tensor1, [])
        return grad1, grad2


matmul_transpose = MatmulApply.apply
