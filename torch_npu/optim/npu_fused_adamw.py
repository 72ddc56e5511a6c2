from .npu_fused_optim_base import NpuFusedOptimizerBase
from .npu_fused_adam import _adam_segment_step, _adam_state_spec, _check_adam_args

__all__ = ["NpuFusedAdamW"]


class NpuFusedAdamW(NpuFusedOptimizerBase):
    r"""Implements the AdamW algorithm (same math as :class:`torch.optim.AdamW`)
    on combined (flat) parameter / gradient / state buffers.

    For further details regarding the algorithm we refer to `Decoupled Weight Decay Regularization`.

    Args:
        params (iterable): iterable of parameters to optimize or dicts defining
            parameter groups
        lr (float, optional): learning rate (default: 1e-3)
        betas (Tuple[float, float], optional): coefficients used for computing
            running averages of gradient and its square (default: (0.9, 0.999))
        eps (float, optional): term added to the denominator to improve
            numerical stability (default: 1e-8)
        weight_decay (float, optional): weight decay coefficient (default: 1e-2)
        amsgrad (boolean, optional): whether to use the AMSGrad variant of this
            algorithm from the paper `On the Convergence of Adam and Beyond`
            (default: False)
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                 weight_decay=1e-2, amsgrad=False):
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
        _adam_segment_step(group, seg, decoupled_weight_decay=True)
