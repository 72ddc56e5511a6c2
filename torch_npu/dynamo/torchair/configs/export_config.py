"""``config.export``: options of ``dynamo_export``."""
from torch_npu.dynamo.torchair.configs._option_base import _Group, _Option, _ON_OFF

__all__ = []


class _ExportConfig(_Group):
    def __init__(self):
        super().__init__(experimental=_Group(enable_lite_export=_Option(False, _ON_OFF),
                                             auto_atc_config_generated=_Option(False, _ON_OFF)))
