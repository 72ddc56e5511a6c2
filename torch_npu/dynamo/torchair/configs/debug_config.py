"""``config.debug``: graph dumps, FX summaries, data dumps, aclgraph debug switches."""
from torch_npu.dynamo.torchair.configs._option_base import _Group, _Option, _ON_OFF

__all__ = []


class _DebugConfig(_Group):
    def __init__(self):
        super().__init__(
            graph_dump=_Group(type=_Option(None, (None, "txt", "pbtxt", "py")), path=_Option("./")),
            fx_summary=_Group(type=_Option(None, (None, "csv"))),
            data_dump=_Group(type=_Option(None, (None, "npy"))),
            aclgraph=_Group(disable_reinplace_inplaceable_ops_pass=_Option(False, _ON_OFF),
                            disable_reinplace_input_mutated_ops_pass=_Option(False, _ON_OFF),
                            enable_output_clone=_Option(False, _ON_OFF)),
        )
