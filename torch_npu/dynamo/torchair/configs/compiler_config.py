"""``torchair.configs.compiler_config.CompilerConfig``: the root of the option tree."""
from torch_npu.dynamo.torchair.configs._option_base import _Group, _Option
from torch_npu.dynamo.torchair.configs.aoe_config import _AoeConfig
from torch_npu.dynamo.torchair.configs.debug_config import _DebugConfig
from torch_npu.dynamo.torchair.configs.dump_config import _DataDumpConfig
from torch_npu.dynamo.torchair.configs.experimental_config import _ExperimentalConfig
from torch_npu.dynamo.torchair.configs.export_config import _ExportConfig
from torch_npu.dynamo.torchair.configs.fusion_config import _FusionConfig
from torch_npu.dynamo.torchair.configs.ge_config import _GEConfig
from torch_npu.dynamo.torchair.configs.inference_config import _InferenceConfig

__all__ = ["CompilerConfig"]


class CompilerConfig(_Group):
    """``torchair.CompilerConfig()``: ``config.mode = "reduce-overhead"`` and friends."""

    def __init__(self):
        super().__init__(
            mode=_Option("max-autotune", ("max-autotune", "reduce-overhead")),
            debug=_DebugConfig(),
            export=_ExportConfig(),
            dump_config=_DataDumpConfig(),
            fusion_config=_FusionConfig(),
            experimental_config=_ExperimentalConfig(),
            inference_config=_InferenceConfig(),
            ge_config=_GEConfig(),
            aoe_config=_AoeConfig(),
        )
