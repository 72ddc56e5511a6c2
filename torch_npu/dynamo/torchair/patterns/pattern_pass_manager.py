"""``register_replacement``: one registry with npugraph_ex's (as in torchair,
where npugraph_ex's delegates here); both backends apply it."""
from torch_npu.npu.npugraph_ex._replacements import register_replacement

__all__ = ["register_replacement"]
