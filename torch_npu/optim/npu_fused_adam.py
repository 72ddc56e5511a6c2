import torch

from torch_npu.utils._error_code import ErrCode, pta_error
from .npu_fused_optim_base import NpuFusedOptimizerBase

__all__ = ["NpuFusedAdam"]


def _check_adam_args(lr, betas, eps, weight_decay):
    if lr < 0.0:
        raise ValueError("Invalid learning rate: {}".format(lr) + pta_error(ErrCode.VALUE))
    if eps < 0.0:
        raise ValueError("Invalid epsilon value: {}".format(eps) + pta_error(ErrCode.VALUE))
    if betas[0] < 0.0 or betas[0] >= 1.0:
        raise ValueError("Invalid beta parameter at index 0: {}".format(betas[0]) + pta_error(ErrCode.VALUE))
    if betas[1] < 0.0 or betas[1] >= 1.0:
        raise ValueError("Invalid beta parameter at index 1: {}".format(betas[1]) + pta_error(ErrCode.VALUE))
    if weight_decay < 0.0:
        raise ValueError("Invalid weight_decay value: {}".format(weight_decay) + pta_error(ErrCode.VALUE))


def _adam_state_spec(group):
    spec = {"exp_avg": 0.0, "exp_avg_sq": 0.0}
    if group["amsgrad"]:
        spec["max_exp_avg_sq"] = 0.0
    return spec


def _adam_segment_step(group, seg, decoupled_weight_decay):
    """torch.optim.Adam / AdamW math (same op sequence) on flat buffers."""
    param, grad = seg.param, seg.grad
    lr, eps, weight_decay = group["lr"], group["eps"], group["weight_decay"]
    beta1, beta2 = group["betas"]
    exp_avg, exp_avg_sq = seg.state["exp_avg"], seg.state["exp_avg_sq"]

    seg.step += 1
    if weight_decay != 0:
        if decoupled_weight_decay:
            param.mul_(1 - lr * weight_decay)
        else:
            grad = grad.add(param, alpha=weight_decay)

    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)

    bias_correction1 = 1 - beta1 ** seg.step
    bias_correction2 = 1 - beta2 ** seg.step
    step_size = lr / bias_correction1
    bias_correction2_sqrt = bias_correction2 ** 0.5

    if group["amsgrad"]:
        max_exp_avg_sq = seg.state["max_exp_avg_sq"]
        torch.maximum(max_exp_avg_sq, exp_avg_sq, out=max_exp_avg_sq)
        denom = (max_exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
    else:
        denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
    param.addcdiv_(exp_avg, denom, value=-step_size)


class NpuFusedAdam(NpuFusedOptimizerBase):
    """Implements the Adam algorithm (same math as :class:`torch.optim.Adam`)
    on combined (flat) parameter / gradient / state buffers.

    Adam was proposed in `Adam: A Method for Stochastic Optimization`.

    Arguments:
        params (iterable): iterable of parameters to optimize or dicts defining
            parameter groups
        lr (float, optional, default=1e-3): learning rate
        betas (Tuple[float, float], optional, default=(0.9, 0.999)): coefficients used for computing
            running averages of gradient and its square
        eps (float, optional, default=1e-8): term added to the denominator to improve
            numerical stability
        weight_decay (float, optional, default=0): weight decay (L2 penalty)
        amsgrad (boolean, optional, default=False): whether to use the AMSGrad variant of this
            algorithm from the paper `On the Convergence of Adam and Beyond`
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                 weight_decay=0, amsgrad=False):
        _check_adam_args(lr, betas, eps, weight_decay)
        defaults = dict(lr=lr, betas=betas, eps=eps,
                        weight_decay=weight_decay, amsgrad=amsgrad)
        super().__init__(params, defaults)

    def __setstate__(self, state):
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("amsgrad", False)

    def _state_spec(self, group):
        return _adam_state_spec(group)

    def _segment_step(self, group, seg):
        _adam_segment_step(group, seg, decoupled_weight_decay=False)
