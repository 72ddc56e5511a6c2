# AdamP: "Slowing Down the Weight Norm Increase in Momentum-based Optimizers"
# (Heo et al., https://arxiv.org/abs/2006.08217; reference implementation
# https://github.com/clovaai/AdamP), here on combined (flat) buffers.
import math

import torch

from .npu_fused_optim_base import NpuFusedOptimizerBase

__all__ = ["NpuFusedAdamP"]


def _cosine_similarity(x, y, eps):
    x_norm = x.norm(dim=1).add_(eps)
    y_norm = y.norm(dim=1).add_(eps)
    dot = (x * y).sum(dim=1)
    return dot.abs() / x_norm / y_norm


def _project(p, grad, perturb, delta, eps):
    """AdamP projection of ``perturb`` for one (>= 2-D) parameter.

    Tries the channel-wise view first, then the layer-wise view, and projects
    the update onto the tangent space of the first view whose maximal cosine
    similarity between gradient and weight is below ``delta / sqrt(dim)``.
    Computed without host synchronisation: returns ``(perturb', projected)``
    with ``projected`` a 0-d bool tensor."""
    expand_size = [-1] + [1] * (p.dim() - 1)
    candidates = []
    for rows in (p.size(0), 1):  # channel-wise view, then layer-wise view
        p_v = p.reshape(rows, -1)
        cosine_sim = _cosine_similarity(grad.reshape(rows, -1), p_v, eps)
        cond = cosine_sim.max() < delta / math.sqrt(p_v.size(1))
        p_n = p / p_v.norm(dim=1).view(expand_size).add_(eps)
        projected = perturb - p_n * (p_n * perturb).reshape(rows, -1).sum(dim=1).view(expand_size)
        candidates.append((projected, cond))
    (per_channel, channel_cond), (per_layer, layer_cond) = candidates
    result = torch.where(channel_cond, per_channel, torch.where(layer_cond, per_layer, perturb))
    return result, channel_cond | layer_cond


class NpuFusedAdamP(NpuFusedOptimizerBase):
    """Implements the AdamP algorithm on combined (flat) parameter / gradient /
    state buffers.

    Arguments:
        params (iterable): iterable of parameters to optimize or dicts defining
            parameter groups
        lr (float, optional, default: 1e-3): learning rate
        betas (Tuple[float, float], optional, default: (0.9, 0.999)): coefficients used
            for computing running averages of gradient and its square
        eps (float, optional, default: 1e-8): term added to the denominator to improve
            numerical stability
        weight_decay (float, optional, default: 0): weight decay coefficient
        delta (float, optional, default: 0.1): threshold of cosine similarity
        wd_ratio (float, optional, default: 0.1): weight decay ratio for dynamic tuning
        nesterov (bool, optional, default: False): enables Nesterov momentum

    .. _Slowing Down the Weight Norm Increase in Momentum-based Optimizers:
        https://arxiv.org/abs/2006.08217
    """

    _extra_state_attrs = ("is_fused_optimizer", "is_npu_fused_optimizer")

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                 weight_decay=0, delta=0.1, wd_ratio=0.1, nesterov=False):
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                        delta=delta, wd_ratio=wd_ratio, nesterov=nesterov)
        self.is_npu_fused_optimizer = True
        super().__init__(params, defaults)

    def _state_spec(self, group):
        return {"exp_avg": 0.0, "exp_avg_sq": 0.0}

    def _segment_step(self, group, seg):
        param, grad = seg.param, seg.grad
        beta1, beta2 = group["betas"]
        lr, eps, weight_decay = group["lr"], group["eps"], group["weight_decay"]
        exp_avg, exp_avg_sq = seg.state["exp_avg"], seg.state["exp_avg_sq"]

        seg.step += 1
        bias_correction1 = 1 - beta1 ** seg.step
        bias_correction2 = 1 - beta2 ** seg.step

        exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        denom = (exp_avg_sq.sqrt() / math.sqrt(bias_correction2)).add_(eps)
        step_size = lr / bias_correction1

        if group["nesterov"]:
            perturb = (beta1 * exp_avg + (1 - beta1) * grad) / denom
        else:
            perturb = exp_avg / denom

        # Projection (only for parameters with more than one dimension)
        projected = []
        no = None
        for p, g, pt in zip(seg.views(param), seg.grad_views, seg.views(perturb)):
            if p.dim() > 1:
                new_pt, taken = _project(p, g, pt, group["delta"], eps)
                pt.copy_(new_pt)
                projected.append(taken)
            else:
                if no is None:
                    no = torch.zeros((), dtype=torch.bool, device=param.device)
                projected.append(no)

        # Weight decay (reduced by wd_ratio for projected parameters)
        if weight_decay > 0:
            factor = torch.where(torch.stack(projected),
                                 1 - lr * weight_decay * group["wd_ratio"],
                                 1 - lr * weight_decay)
            param.mul_(seg.expand(factor))

        # Step
        param.add_(perturb, alpha=-step_size)
