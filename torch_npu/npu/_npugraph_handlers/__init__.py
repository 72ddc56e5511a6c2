"""Operator handlers for ``NPUGraph`` capture with ``auto_dispatch_capture=True`` (see ``npugraph_handler``)."""
from .npugraph_handler import NpuGraphOpHandler, register_npu_graph_handler, find_handler  # noqa: F401

__all__ = ["NpuGraphOpHandler", "register_npu_graph_handler"]
