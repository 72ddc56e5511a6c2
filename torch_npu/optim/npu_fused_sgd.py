import math

import torch
from torch.optim.optimizer import required

from torch_npu.utils._error_code import ErrCode, pta_error
from .npu_fused_optim_base import NpuFusedOptimizerBase

LR_MIN = 0.0
MOMENTUM_MIN = 0.0
DAMPENING_DEFAULT = 0.0
WEIGHT_DECAY_MIN = 0.0

__all__ = ["NpuFusedSGD"]


class NpuFusedSGD(NpuFusedOptimizerBase):
    r"""Implements stochastic gradient descent (optionally with momentum) on
    combined (flat) parameter / gradient / momentum buffers.

    Same math as :class:`torch.optim.SGD`; Nesterov momentum is based on the
    formula from `On the importance of initialization and momentum in deep learning`.

    Args:
        params (iterable): iterable of parameters to optimize or dicts defining
            parameter groups
        lr (float): learning rate
        momentum (float, optional, default=0): momentum factor
        dampening (float, optional, default=0): dampening for momentum
        weight_decay (float, optional, default=0): weight decay (L2 penalty)
        nesterov (bool, optional, default=False): enables Nesterov momentum
    """

    _has_step = False

    def __init__(self,
                 params,
                 lr=required,
                 momentum=MOMENTUM_MIN,
                 dampening=DAMPENING_DEFAULT,
                 weight_decay=WEIGHT_DECAY_MIN,
                 nesterov=False):
        if lr is not required and lr < LR_MIN:
            raise ValueError("Invalid learning rate: {}".format(lr) + pta_error(ErrCode.VALUE))
        if momentum < MOMENTUM_MIN:
            raise ValueError("Invalid momentum value: {}".format(momentum) + pta_error(ErrCode.VALUE))
        if weight_decay < WEIGHT_DECAY_MIN:
            raise ValueError("Invalid weight_decay value: {}".format(weight_decay) + pta_error(ErrCode.VALUE))
        if nesterov and (momentum <= MOMENTUM_MIN or not math.isclose(dampening, DAMPENING_DEFAULT, abs_tol=1e-15)):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening" + pta_error(ErrCode.VALUE))
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening,
                        weight_decay=weight_decay, nesterov=nesterov)
        super().__init__(params, defaults)

    def __setstate__(self, state):
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("nesterov", False)

    def _segment_key(self, p):
        # params whose momentum buffer does not exist yet start it from the
        # (weight-decayed) gradient: keep them apart from the others
        st = self.state.get(p)
        return bool(st) and isinstance(st.get("momentum_buffer"), torch.Tensor)

    def _state_spec(self, group):
        return {"momentum_buffer": 0.0} if group["momentum"] != 0 else {}

    def _segment_step(self, group, seg):
        weight_decay = group["weight_decay"]
        momentum = group["momentum"]
        dampening = group["dampening"]
        param, grad = seg.param, seg.grad

        if weight_decay != 0:
            grad = grad.add(param, alpha=weight_decay)
        if momentum != 0:
            buf = seg.state["momentum_buffer"]
            if seg.fresh:
                buf.copy_(grad)
                seg.fresh = False
            else:
                buf.mul_(momentum).add_(grad, alpha=1 - dampening)
            if group["nesterov"]:
                grad = grad.add(buf, alpha=momentum)
            else:
                grad = buf
        param.add_(grad, alpha=-group["lr"])
