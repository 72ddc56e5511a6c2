"""``config.inference_config``: how dimension gears combine."""
from torch_npu.dynamo.torchair.configs._option_base import _Group, _Option

__all__ = []


class _InferenceConfig(_Group):
    def __init__(self):
        super().__init__(dynamic_gears_merge_policy=_Option("zip", ("zip", "product")))
