"""``config.aoe_config``: AOE auto-tuning options."""
from torch_npu.dynamo.torchair.configs._option_base import _Group, _Option

__all__ = []


class _AoeConfig(_Group):
    def __init__(self):
        super().__init__(aoe_mode=_Option(None, (None, "1", "2")), work_path=_Option("./"),
                         aoe_config_file=_Option(None))
