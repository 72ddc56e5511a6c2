from torch_npu.utils._error_code import ErrCode, pta_error
from .npu_fused_optim_base import NpuFusedOptimizerBase

__all__ = ["NpuFusedRMSprop"]


def _check_rmsprop_args(lr, alpha, eps, weight_decay, momentum):
    """Argument checks shared by NpuFusedRMSprop and NpuFusedRMSpropTF."""
    if lr < 0.0:
        raise ValueError("Invalid learning rate: {}".format(lr) + pta_error(ErrCode.VALUE))
    if eps < 0.0:
        raise ValueError("Invalid epsilon value: {}".format(eps) + pta_error(ErrCode.VALUE))
    if momentum < 0.0:
        raise ValueError("Invalid momentum value: {}".format(momentum) + pta_error(ErrCode.VALUE))
    if weight_decay < 0.0:
        raise ValueError("Invalid weight_decay value: {}".format(weight_decay) + pta_error(ErrCode.VALUE))
    if alpha < 0.0:
        raise ValueError("Invalid alpha value: {}".format(alpha) + pta_error(ErrCode.VALUE))


class NpuFusedRMSprop(NpuFusedOptimizerBase):
    r"""Implements the RMSprop algorithm (same math as :class:`torch.optim.RMSprop`)
    on combined (flat) parameter / gradient / state buffers.

    The square root of the gradient average is taken before adding epsilon
    (TensorFlow interchanges these two operations, see NpuFusedRMSpropTF).

    Arguments:
        params (iterable): iterable of parameters to optimize or dicts defining
            parameter groups
        lr (float, optional, default: 1e-2): learning rate
        alpha (float, optional, default: 0.99): smoothing constant
        eps (float, optional, default: 1e-8): term added to the denominator to improve
            numerical stability
        weight_decay (float, optional, default: 0): weight decay (L2 penalty)
        momentum (float, optional, default: 0): momentum factor
        centered (bool, optional, default: False) : if ``True``, compute the centered RMSProp,
            the gradient is normalized by an estimation of its variance
    """

    def __init__(self, params, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0, momentum=0, centered=False):
        _check_rmsprop_args(lr, alpha, eps, weight_decay, momentum)
        defaults = dict(lr=lr, momentum=momentum, alpha=alpha, eps=eps, centered=centered,
                        weight_decay=weight_decay)
        super().__init__(params, defaults)

    def __setstate__(self, state):
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("momentum", 0)
            group.setdefault("centered", False)

    def _state_spec(self, group):
        spec = {"square_avg": 0.0}
        if group["momentum"] > 0:
            spec["momentum_buffer"] = 0.0
        if group["centered"]:
            spec["grad_avg"] = 0.0
        return spec

    def _segment_step(self, group, seg):
        param, grad = seg.param, seg.grad
        alpha, lr, eps = group["alpha"], group["lr"], group["eps"]
        square_avg = seg.state["square_avg"]
        seg.step += 1

        if group["weight_decay"] != 0:
            grad = grad.add(param, alpha=group["weight_decay"])

        square_avg.mul_(alpha).addcmul_(grad, grad, value=1 - alpha)
        if group["centered"]:
            grad_avg = seg.state["grad_avg"]
            grad_avg.lerp_(grad, 1 - alpha)
            avg = square_avg.addcmul(grad_avg, grad_avg, value=-1).sqrt_()
        else:
            avg = square_avg.sqrt()
        avg = avg.add_(eps)

        if group["momentum"] > 0:
            buf = seg.state["momentum_buffer"]
            buf.mul_(group["momentum"]).addcdiv_(grad, avg)
            param.add_(buf, alpha=-lr)
        else:
            param.addcdiv_(grad, avg, value=-lr)
