"""``config.ge_config``: GE graph engine options."""
from torch_npu.dynamo.torchair.configs._option_base import _Group, _Option, _ON_OFF

__all__ = []


class _GEConfig(_Group):
    def __init__(self):
        super().__init__(enable_single_stream=_Option(False, _ON_OFF),
                         oo_level=_Option("O3", ("O1", "O3")),
                         export_compile_stat=_Option("1", ("0", "1", "2")))
