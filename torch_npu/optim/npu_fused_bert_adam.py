import math

import torch
from torch.optim.optimizer import required

from torch_npu.utils._error_code import ErrCode, pta_error
from .npu_fused_optim_base import NpuFusedOptimizerBase

__all__ = ["NpuFusedBertAdam"]


WARMUP_DEFAULT = 0.002
DEGREE_DEFAULT = 0.5


def _warmup_cosine(x, warmup=WARMUP_DEFAULT):
    if x < warmup:
        return x / warmup
    return 0.5 * (1.0 + math.cos(math.pi * x))


def _warmup_constant(x, warmup=WARMUP_DEFAULT):
    if x < warmup:
        return x / warmup
    return 1.0


def _warmup_linear(x, warmup=WARMUP_DEFAULT):
    if x < warmup:
        return x / warmup
    return max((x - 1.) / (warmup - 1.), 0.)


def _warmup_poly(x, warmup=WARMUP_DEFAULT, degree=DEGREE_DEFAULT):
    if x < warmup:
        return x / warmup
    return (1.0 - x) ** degree


SCHEDULES = {
    'warmup_cosine': _warmup_cosine,
    'warmup_constant': _warmup_constant,
    'warmup_linear': _warmup_linear,
    'warmup_poly': _warmup_poly,
}


class NpuFusedBertAdam(NpuFusedOptimizerBase):
    """Implements the BERT version of Adam (Adam with decoupled weight decay,
    no bias correction, learning-rate warmup schedules and gradient clipping)
    on combined (flat) parameter / gradient / state buffers.

    Gradient clipping is fused too: the gradients of each param group (per
    dtype) are clipped together to a total 2-norm of ``max_grad_norm``.

    Params:
        lr: learning rate
        warmup: portion of t_total for the warmup, -1  means no warmup. Default: -1
        t_total: total number of training steps for the learning
            rate schedule, -1  means constant learning rate. Default: -1
        schedule: schedule to use for the warmup ('warmup_cosine', 'warmup_constant',
            'warmup_linear', 'warmup_poly'). Default: 'warmup_linear'
        b1: Adams b1. Default: 0.9
        b2: Adams b2. Default: 0.999
        e: Adams epsilon. Default: 1e-6
        weight_decay: Weight decay. Default: 0.01
        max_grad_norm: Maximum norm for the gradients (-1 means no clipping). Default: 1.0
    """

    _extra_state_attrs = ("is_fused_optimizer", "max_grad_norm")

    def __init__(self, params, lr=required, warmup=-1, t_total=-1, schedule='warmup_linear',
                 b1=0.9, b2=0.999, e=1e-6, weight_decay=0.01,
                 max_grad_norm=1.0):
        if lr is not required and lr < 0.0:
            raise ValueError("Invalid learning rate: {}".format(lr) + pta_error(ErrCode.VALUE))
        if (warmup < 0.0 and warmup != -1) or warmup >= 1.0:
            raise ValueError("Invalid warmup: {}".format(warmup) + pta_error(ErrCode.VALUE))
        if schedule not in SCHEDULES:
            raise ValueError("Invalid schedule parameter: {}".format(schedule) + pta_error(ErrCode.VALUE))
        if b1 < 0.0 or b1 >= 1.0:
            raise ValueError("Invalid b1 parameter: {}".format(b1) + pta_error(ErrCode.VALUE))
        if b2 < 0.0 or b2 >= 1.0:
            raise ValueError("Invalid b2 parameter: {}".format(b2) + pta_error(ErrCode.VALUE))
        if e < 0.0:
            raise ValueError("Invalid epsilon value: {}".format(e) + pta_error(ErrCode.VALUE))
        defaults = dict(lr=lr, schedule=schedule, warmup=warmup, t_total=t_total,
                        b1=b1, b2=b2, e=e, weight_decay=weight_decay,
                        max_grad_norm=max_grad_norm)
        self.max_grad_norm = max_grad_norm
        super().__init__(params, defaults)

    def _state_spec(self, group):
        return {"exp_avg": 0.0, "exp_avg_sq": 0.0}

    @staticmethod
    def _scheduled_lr(group, step):
        if group['t_total'] != -1:
            schedule_fct = SCHEDULES[group['schedule']]
            return group['lr'] * schedule_fct(step / group['t_total'], group['warmup'])
        return group['lr']

    def _run_segments(self):
        # fused clipping: the whole gradient of each group (per dtype)
        for gi, group in enumerate(self.param_groups):
            max_grad_norm = group.get('max_grad_norm', self.max_grad_norm)
            if max_grad_norm is None or max_grad_norm <= 0:
                continue
            for combined_grad in self.combined_grads_indexed_by_group[gi]:
                if combined_grad is None or combined_grad.numel() == 0:
                    continue
                total_norm = combined_grad.float().pow(2).sum().sqrt()
                clip_coef = torch.clamp(max_grad_norm / (total_norm + 1e-6), max=1.0)
                combined_grad.mul_(clip_coef.to(combined_grad.dtype))
        super()._run_segments()

    def _segment_step(self, group, seg):
        param, grad = seg.param, seg.grad
        beta1, beta2 = group['b1'], group['b2']
        exp_avg, exp_avg_sq = seg.state['exp_avg'], seg.state['exp_avg_sq']

        exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        update = exp_avg / (exp_avg_sq.sqrt() + group['e'])
        if group['weight_decay'] > 0.0:
            update += group['weight_decay'] * param

        lr_scheduled = self._scheduled_lr(group, seg.step)
        update_with_lr = lr_scheduled * update
        param.add_(-update_with_lr)
        seg.step += 1
