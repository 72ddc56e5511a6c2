"""``config.dump_config``: tensor dumps of the compiled graph."""
from torch_npu.dynamo.torchair.configs._option_base import _Group, _Option, _ON_OFF

__all__ = []


class _DataDumpConfig(_Group):
    def __init__(self):
        super().__init__(enable_dump=_Option(False, _ON_OFF), dump_path=_Option("./"),
                         dump_mode=_Option("all", ("input", "output", "all")))
