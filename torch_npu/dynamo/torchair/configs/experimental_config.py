"""``config.experimental_config``: experimental graph options."""
from torch_npu.dynamo.torchair.configs._option_base import _Group, _Option, _ON_OFF

__all__ = []


class _ExperimentalConfig(_Group):
    def __init__(self):
        super().__init__(
            cc_parallel_enable=_Option(False, _ON_OFF),
            keep_inference_input_mutations=_Option(True, _ON_OFF),
            memory_efficiency=_Option(False, _ON_OFF),
            separate_atomic_clean=_Option(True, _ON_OFF),
            frozen_parameter=_Option(False, _ON_OFF),
            static_model_ops_lower_limit=_Option(None),
            jit_compile=_Option("auto", ("auto", True, False)),
            npu_fx_pass=_Option(False, _ON_OFF),
            topology_sorting_strategy=_Option("DFS", ("BFS", "DFS", "RDFS", "StableRDFS")),
            enable_single_stream=_Option(False, _ON_OFF),
            remove_noop_ops=_Option(True, _ON_OFF),
            aclgraph=_Group(disable_reinplace_inplaceable_ops_pass=_Option(False, _ON_OFF)),
        )
