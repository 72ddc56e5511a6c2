"""torch_npu.contrib.function: detection / transformer helpers built on torch_npu custom ops."""
from .nms import npu_multiclass_nms, npu_batched_multiclass_nms
from .anchor_generator import npu_single_level_responsible_flags
from .bbox_coder import npu_bbox_coder_encode_yolo, npu_bbox_coder_encode_xyxy2xywh, \
    npu_bbox_coder_decode_xywh2xyxy
from .index_op import npu_fast_condition_index_put
from .fuse_add_softmax_dropout import fuse_add_softmax_dropout
from .roll import roll
from .matmul_transpose import matmul_transpose
from .fused_attention import npu_fused_attention, npu_fused_attention_with_layernorm
from .npu_functional import dropout_with_byte_mask

__all__ = [
    "npu_multiclass_nms",
    "npu_batched_multiclass_nms",
    "npu_single_level_responsible_flags",
    "npu_fast_condition_index_put",
    "npu_bbox_coder_encode_yolo",
    "npu_bbox_coder_encode_xyxy2xywh",
    "npu_bbox_coder_decode_xywh2xyxy",
    "fuse_add_softmax_dropout",
    "roll",
    "matmul_transpose",
    "npu_fused_attention",
    "npu_fused_attention_with_layernorm",
    "dropout_with_byte_mask",
]
