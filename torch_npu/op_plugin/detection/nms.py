"""Non-maximum suppression: npu_nms_v4 (TensorFlow NonMaxSuppressionV4 semantics).

The number of kept boxes depends on the values, so the op is registered opaque: one node
under torch.compile, running the host NMS at run time; its fake kernel gives the
unpadded index output a data-dependent length (an unbacked size, 0 <= n <= min(N,
max_output_size))."""
import torch
from torch._subclasses.fake_tensor import is_fake

from torch_npu.op_plugin._common import check
from torch_npu.op_plugin._opaque_vjp import non_differentiable
from torch_npu.op_plugin._registry import opaque

__all__ = []


def _pair_iou(boxes):
    """IoU of every pair of (N, 4) boxes; corners in either order (min/max taken per axis)."""
    lo = torch.minimum(boxes[:, :2], boxes[:, 2:])
    hi = torch.maximum(boxes[:, :2], boxes[:, 2:])
    area = (hi - lo).prod(-1)
    wh = (torch.minimum(hi[:, None], hi[None]) - torch.maximum(lo[:, None], lo[None])).clamp_min(0)
    inter = wh.prod(-1)
    union = area[:, None] + area[None] - inter
    return torch.where((area[:, None] > 0) & (area[None] > 0), inter / union, torch.zeros_like(inter))


def greedy_nms(boxes, scores, max_output, iou_threshold, score_threshold):
    """Indices kept by greedy NMS: candidates with ``score > score_threshold`` in descending
    score order (ties: lower index first); a candidate is dropped when its IoU with an already
    kept box is ``> iou_threshold``; at most ``max_output`` kept."""
    order = sorted((i for i, s in enumerate(scores.tolist()) if s > score_threshold),
                   key=lambda i: -scores[i].item())
    iou = _pair_iou(boxes.double()).tolist()
    kept = []
    for i in order:
        if len(kept) >= max_output:
            break
        if all(iou[i][k] <= iou_threshold for k in kept):
            kept.append(i)
    return kept


def _check_nms_v4(self, scores, max_output_size):
    op = "npu_nms_v4"
    check(self.dim() == 2 and self.size(1) == 4, op, "boxes must be (N, 4), got %s" % (tuple(self.shape),))
    check(scores.dim() == 1 and scores.size(0) == self.size(0), op, "scores must be (N,)")
    max_out = int(max_output_size)
    check(max_out >= 0, op, "max_output_size must be >= 0, got %d" % max_out)
    return max_out


def _nms_v4_fake(self, scores, max_output_size, iou_threshold, scores_threshold, pad_to_max_output_size=False):
    max_out = _check_nms_v4(self, scores, max_output_size)
    if pad_to_max_output_size:
        n = max_out
    elif not is_fake(self):  # plain meta tensors have no symbol for the kept count
        raise NotImplementedError("npu_nms_v4: the number of kept boxes depends on the values; meta tensors "
                                  "cannot hold it (FakeTensor tracing gives it a data-dependent size)")
    else:
        n = torch.library.get_ctx().new_dynamic_size(min=0, max=min(max_out, self.size(0)))
    return self.new_empty((n,), dtype=torch.int32), self.new_empty((), dtype=torch.int32)


@opaque("npu_nms_v4", fake=_nms_v4_fake)
def npu_nms_v4(self, scores, max_output_size, iou_threshold, scores_threshold, pad_to_max_output_size=False):
    """Greedy NMS of ``self`` (N, 4) boxes with ``scores`` (N,): see :func:`greedy_nms`
    (boxes with IoU ``> iou_threshold`` against a kept box are suppressed, scores
    ``<= scores_threshold`` never kept). Returns ``(selected_indices, valid_outputs)``:
    int32 indices in selection order (length ``valid_outputs``, or ``max_output_size`` padded
    with zeros when ``pad_to_max_output_size``) and the int32 0-D count."""
    max_out = _check_nms_v4(self, scores, max_output_size)
    kept = greedy_nms(self.detach().cpu(), scores.detach().cpu().double(), max_out,
                      float(iou_threshold), float(scores_threshold))
    n = max_out if pad_to_max_output_size else len(kept)
    idx = torch.zeros(n, dtype=torch.int32)
    idx[:len(kept)] = torch.tensor(kept, dtype=torch.int32)
    return idx.to(self.device), torch.tensor(len(kept), dtype=torch.int32).to(self.device)


non_differentiable("npu_nms_v4")
