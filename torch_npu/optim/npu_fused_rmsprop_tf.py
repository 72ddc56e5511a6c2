from torch_npu.utils._error_code import ErrCode, pta_error
from .npu_fused_optim_base import NpuFusedOptimizerBase
from .npu_fused_rmsprop import _check_rmsprop_args

__all__ = ["NpuFusedRMSpropTF"]


class NpuFusedRMSpropTF(NpuFusedOptimizerBase):
    """Implements the TensorFlow-style RMSprop of timm (``RMSpropTF``) on
    combined (flat) parameter / gradient / state buffers.

    Differences to :class:`torch.optim.RMSprop`: ``square_avg`` starts at ones,
    epsilon is added inside the square root, the moving averages are updated
    in TensorFlow's order (``avg += (1 - alpha) * (x - avg)``), the learning
    rate can be accumulated in the momentum buffer (``lr_in_momentum``) and the
    weight decay can be decoupled from the gradient (``decoupled_decay``:
    ``param -= weight_decay * param`` before the update, as in the RMSpropTF
    of timm that the real torch_npu is based on).

    Arguments:
        params (iterable): iterable of parameters to optimize or dicts defining
            parameter groups
        lr (float, optional, default: 1e-2): learning rate
        alpha (float, optional, default: 0.9): smoothing constant
        eps (float, optional, default: 1e-10): term added to the denominator to improve
            numerical stability
        weight_decay (float, optional, default: 0): weight decay (L2 penalty)
        momentum (float, optional, default: 0): momentum factor
        centered (bool, optional, default: False) : if ``True``, compute the centered RMSProp,
            the gradient is normalized by an estimation of its variance
        decoupled_decay (bool, optional, default: False) : if ``True``, weight_decay will only be applied to param.
        lr_in_momentum (bool, optional, default: True) : if ``True``, lr is used when calculating momentum_buffer.
    """

    def __init__(self, params, lr=1e-2, alpha=0.9, eps=1e-10, weight_decay=0, momentum=0., centered=False,
                 decoupled_decay=False, lr_in_momentum=True):
        _check_rmsprop_args(lr, alpha, eps, weight_decay, momentum)
        defaults = dict(lr=lr, momentum=momentum, alpha=alpha, eps=eps, centered=centered,
                        weight_decay=weight_decay, decoupled_decay=decoupled_decay,
                        lr_in_momentum=lr_in_momentum)
        super().__init__(params, defaults)

    def __setstate__(self, state):
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("momentum", 0)
            group.setdefault("centered", False)

    def _state_spec(self, group):
        spec = {"square_avg": 1.0}  # PyTorch's RMSprop starts at zero
        if group["momentum"] > 0:
            spec["momentum_buffer"] = 0.0
        if group["centered"]:
            spec["grad_avg"] = 0.0
        return spec

    def _segment_step(self, group, seg):
        param, grad = seg.param, seg.grad
        lr, eps = group["lr"], group["eps"]
        one_minus_alpha = 1. - group["alpha"]
        square_avg = seg.state["square_avg"]
        seg.step += 1

        if group["weight_decay"] != 0:
            if group.get("decoupled_decay", False):
                param.add_(param, alpha=-group["weight_decay"])
            else:
                grad = grad.add(param, alpha=group["weight_decay"])

        # TensorFlow order of ops for updating the squared average
        square_avg.add_(grad.pow(2) - square_avg, alpha=one_minus_alpha)
        if group["centered"]:
            grad_avg = seg.state["grad_avg"]
            grad_avg.add_(grad - grad_avg, alpha=one_minus_alpha)
            avg = square_avg.addcmul(grad_avg, grad_avg, value=-1).add(eps).sqrt_()  # eps inside sqrt
        else:
            avg = square_avg.add(eps).sqrt_()  # eps inside sqrt

        if group["momentum"] > 0:
            buf = seg.state["momentum_buffer"]
            if group.get("lr_in_momentum", True):
                # TensorFlow accumulates the LR scaling in the momentum buffer
                buf.mul_(group["momentum"]).addcdiv_(grad, avg, value=lr)
                param.add_(-buf)
            else:
                buf.mul_(group["momentum"]).addcdiv_(grad, avg)
                param.add_(buf, alpha=-lr)
        else:
            param.addcdiv_(grad, avg, value=-lr)
