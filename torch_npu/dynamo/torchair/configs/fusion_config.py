"""``config.fusion_config``: the GE fusion switch file."""
from torch_npu.dynamo.torchair.configs._option_base import _Group, _Option

__all__ = []


class _FusionConfig(_Group):
    def __init__(self):
        super().__init__(fusion_switch_file=_Option(None))
