from torch_npu.utils._error_code import ErrCode, pta_error
from .npu_fused_optim_base import NpuFusedOptimizerBase

__all__ = ["NpuFusedAdadelta"]


class NpuFusedAdadelta(NpuFusedOptimizerBase):
    """Implements the Adadelta algorithm (same math as :class:`torch.optim.Adadelta`)
    on combined (flat) parameter / gradient / state buffers.

    It has been proposed in `ADADELTA: An Adaptive Learning Rate Method`.

    Arguments:
        params (iterable): iterable of parameters to optimize or dicts defining
            parameter groups
        lr (float, optional, default=1.0): coefficient that scale delta before it is applied
            to the parameters
        rho (float, optional, default=0.9): coefficient used for computing a running average
            of squared gradients
        eps (float, optional, default=1e-6): term added to the denominator to improve
            numerical stability
        weight_decay (float, optional, default=0): weight decay (L2 penalty)
    """

    def __init__(self, params, lr=1.0, rho=0.9, eps=1e-6, weight_decay=0):
        if lr < 0.0:
            raise ValueError("Invalid learning rate: {}".format(lr) + pta_error(ErrCode.VALUE))
        if rho < 0.0 or rho > 1.0:
            raise ValueError("Invalid rho value: {}".format(rho) + pta_error(ErrCode.VALUE))
        if eps < 0.0:
            raise ValueError("Invalid epsilon value: {}".format(eps) + pta_error(ErrCode.VALUE))
        if weight_decay < 0.0:
            raise ValueError("Invalid weight_decay value: {}".format(weight_decay) + pta_error(ErrCode.VALUE))
        defaults = dict(lr=lr, rho=rho, eps=eps, weight_decay=weight_decay)
        super().__init__(params, defaults)

    def _state_spec(self, group):
        return {"square_avg": 0.0, "acc_delta": 0.0}

    def _segment_step(self, group, seg):
        param, grad = seg.param, seg.grad
        rho, eps = group["rho"], group["eps"]
        square_avg, acc_delta = seg.state["square_avg"], seg.state["acc_delta"]
        seg.step += 1

        if group["weight_decay"] != 0:
            grad = grad.add(param, alpha=group["weight_decay"])

        square_avg.mul_(rho).addcmul_(grad, grad, value=1 - rho)
        std = square_avg.add(eps).sqrt_()
        delta = acc_delta.add(eps).sqrt_()
        delta.div_(std).mul_(grad)
        acc_delta.mul_(rho).addcmul_(delta, delta, value=1 - rho)
        param.add_(delta, alpha=-group["lr"])
