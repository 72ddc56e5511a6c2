"""torchair's option modules, one per group of ``CompilerConfig`` (as in torchair).

``CompilerConfig`` is also reachable here, where it lived before the split.
"""
from torch_npu.dynamo.torchair.configs.compiler_config import CompilerConfig

__all__ = []
