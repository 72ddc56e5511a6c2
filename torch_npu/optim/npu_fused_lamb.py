# LAMB: "Large Batch Optimization for Deep Learning: Training BERT in 76
# minutes" (You et al., https://arxiv.org/abs/1904.00962), following the
# pytorch-lamb formulation (https://github.com/cybertronai/pytorch-lamb) that
# the real torch_npu uses, here on combined (flat) buffers.
import torch

from torch_npu.utils._error_code import ErrCode, pta_error
from .npu_fused_optim_base import NpuFusedOptimizerBase

__all__ = ["NpuFusedLamb"]


class NpuFusedLamb(NpuFusedOptimizerBase):
    r"""Implements the LAMB algorithm on combined (flat) parameter / gradient /
    state buffers.

    Per parameter: ``adam_step = exp_avg / (sqrt(exp_avg_sq) + eps) +
    weight_decay * p`` (no bias correction), ``trust_ratio = clamp(||p||, 0, 10)
    / ||adam_step||`` (1 where either norm is 0), ``p -= lr * trust_ratio *
    adam_step``.

    Arguments:
        params (iterable): iterable of parameters to optimize or dicts defining
            parameter groups
        lr (float, optional, default=1e-3): learning rate
        betas (Tuple[float, float], optional, default=(0.9, 0.999)): coefficients used for computing
            running averages of gradient and its square
        eps (float, optional, default=1e-6): term added to the denominator to improve
            numerical stability
        weight_decay (float, optional, default=0): weight decay (L2 penalty)
        adam (bool, optional): always use trust ratio = 1, which turns this into
            Adam. Useful for comparison purposes.
        use_global_grad_norm(bool, optional, default=False): divide the gradients
            by their global 2-norm (over all groups) when it exceeds 1

    .. _Large Batch Optimization for Deep Learning: Training BERT in 76 minutes:
        https://arxiv.org/abs/1904.00962
    """

    _extra_state_attrs = ("is_fused_optimizer", "is_npu_fused_optimizer", "adam", "use_global_grad_norm",
                          "global_grad_norm")

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6,
                 weight_decay=0, adam=False, use_global_grad_norm=False):
        if lr < 0.0:
            raise ValueError("Invalid learning rate: {}".format(lr) + pta_error(ErrCode.VALUE))
        if betas[0] < 0.0 or betas[0] >= 1.0:
            raise ValueError("Invalid beta parameter at index 0: {}".format(betas[0]) + pta_error(ErrCode.VALUE))
        if betas[1] < 0.0 or betas[1] >= 1.0:
            raise ValueError("Invalid beta parameter at index 1: {}".format(betas[1]) + pta_error(ErrCode.VALUE))
        if eps < 0.0:
            raise ValueError("Invalid epsilon value: {}".format(eps) + pta_error(ErrCode.VALUE))
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        self.adam = adam
        self.use_global_grad_norm = use_global_grad_norm
        self.is_npu_fused_optimizer = True
        self.global_grad_norm = torch.ones(1)
        super().__init__(params, defaults)

    def _state_spec(self, group):
        return {"exp_avg": 0.0, "exp_avg_sq": 0.0}

    def _get_global_grad_norm(self):
        return self._total_norm([b.grad for b in self._buckets], 2.0)

    def _run_segments(self):
        if self.use_global_grad_norm:
            norm = self._get_global_grad_norm()
            if norm is not None:
                self.global_grad_norm = norm
        super()._run_segments()

    def _segment_step(self, group, seg):
        param, grad = seg.param, seg.grad
        beta1, beta2 = group["betas"]
        lr = group["lr"]
        exp_avg, exp_avg_sq = seg.state["exp_avg"], seg.state["exp_avg_sq"]

        if self.use_global_grad_norm:
            # divide by the global norm only when it is above 1
            norm = self.global_grad_norm.to(device=grad.device)
            grad = grad / torch.clamp(norm, min=1.0).to(grad.dtype)

        seg.step += 1
        exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)

        adam_step = exp_avg / exp_avg_sq.sqrt().add(group["eps"])
        if group["weight_decay"] != 0:
            adam_step.add_(param, alpha=group["weight_decay"])

        if self.adam:
            param.add_(adam_step, alpha=-lr)
            return
        weight_norm = torch.stack(torch._foreach_norm(seg.views(param))).float().clamp(0, 10)
        adam_norm = torch.stack(torch._foreach_norm(seg.views(adam_step))).float()
        trust_ratio = torch.where((weight_norm == 0) | (adam_norm == 0),
                                  torch.ones_like(weight_norm), weight_norm / adam_norm)
        param.addcmul_(adam_step, seg.expand(trust_ratio * -lr).to(param.dtype))
