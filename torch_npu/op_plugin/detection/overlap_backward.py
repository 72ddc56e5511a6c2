"""Emulated backward ops of the detection family: npu_diou_backward, npu_giou_backward and
npu_roi_alignbk, each built on the math of the forward op this package already emulates.

* ``npu_diou_backward(grad, bboxes, gtboxes, trans, is_cross, mode)`` and
  ``npu_giou_backward(...)``: the vector-Jacobian product of npu_diou / npu_giou (the
  ``DIoUGrad`` / ``GIoUGrad`` kernels): ``dbboxes = sum_k grad_k * d overlap_k / d bboxes``,
  likewise ``dgtboxes``. op-plugin squeezes the leading 1 of the gradient (``[1, N]`` aligned
  overlaps); any gradient holding one value per overlap is accepted. It computes in float32 for
  float16 inputs and returns float16 if either box tensor is float16 (else the boxes' dtype).
  npu_giou_backward only exists for ``trans=True, is_cross=False, mode=0`` (op-plugin's check,
  same message); npu_diou_backward accepts what npu_diou accepts (``mode=0``, aligned or cross).
* ``npu_roi_alignbk(grad, rois, xdiff_shape, pooled_width, pooled_height, spatial_scale,
  sample_num, roi_end_mode=None)``: the adjoint of npu_roi_align (``ROIAlignGrad``): every
  bilinear sample of every bin sends ``grad / (samples per bin)`` times its four corner
  weights back to the feature map ``xdiff_shape``; ``roi_end_mode=None`` is op-plugin's
  default 1. RoIAlign is linear in the features, so this is its exact gradient. The RoI
  boxes are read on the host (as npu_roi_align does), so the op is registered opaque: a
  FakeTensor / Meta call returns the ``xdiff_shape`` output without reading values.
"""
import math

import torch

from torch_npu.op_plugin._common import check
from torch_npu.op_plugin._registry import impl, opaque
from torch_npu.op_plugin.detection.box_overlap import npu_diou as _diou_forward
from torch_npu.op_plugin.detection.boxes import npu_giou as _giou_forward
from torch_npu.op_plugin.detection.roi_align import _axis, _roi_box

__all__ = []


def _box_grad_dtype(bboxes, gtboxes):
    return torch.float16 if torch.float16 in (bboxes.dtype, gtboxes.dtype) else bboxes.dtype


def _overlap_vjp(op, forward, grad, bboxes, gtboxes, *args):
    """(d bboxes, d gtboxes) of ``sum(grad * forward(bboxes, gtboxes, *args))`` in the compute
    precision (float32 for float16/bfloat16 boxes, float64 kept for gradcheck)."""
    compute = torch.float64 if bboxes.dtype == torch.float64 else torch.float32
    with torch.enable_grad():
        b = bboxes.detach().to(compute).requires_grad_(True)
        g = gtboxes.detach().to(compute).requires_grad_(True)
        overlap = forward(b, g, *args)
        check(grad.numel() == overlap.numel(), op, "grad must hold one value per overlap (%d), got shape %s"
              % (overlap.numel(), tuple(grad.shape)))
        db, dg = torch.autograd.grad(overlap, (b, g), grad.detach().to(overlap.dtype).reshape(overlap.shape))
    out = _box_grad_dtype(bboxes, gtboxes)
    return db.to(out), dg.to(out)


@impl("npu_diou_backward")
def npu_diou_backward(grad, bboxes, gtboxes, trans=False, is_cross=False, mode=0):
    """Gradient of npu_diou with respect to both box tensors (see the module docstring)."""
    return _overlap_vjp("npu_diou_backward", _diou_forward, grad, bboxes, gtboxes, trans, is_cross, mode)


@impl("npu_giou_backward")
def npu_giou_backward(grad, bboxes, gtboxes, trans=False, is_cross=False, mode=0):
    """Gradient of npu_giou with respect to both box tensors (see the module docstring)."""
    check(trans and not is_cross and mode == 0, "npu_giou_backward",
          "giou backward only support trans==True, is_cross==False, mode==0('iou') current version "
          "if you need to back propagation, please ensure your parameter is correct!")
    return _overlap_vjp("npu_giou_backward", _giou_forward, grad, bboxes, gtboxes, trans, is_cross, mode)


# roi_end_mode when the argument is None (op-plugin's aclnnROIAlignBackward call)
_ROI_END_MODE_DEFAULT = 1


def _roi_alignbk_checks(grad, rois, xdiff_shape, pooled_width, pooled_height, sample_num, mode):
    op = "npu_roi_alignbk"
    check(len(xdiff_shape) == 4, op, "xdiff_shape must be (B, C, H, W), got %s" % (list(xdiff_shape),))
    check(grad.dim() == 4, op, "grad must be (N, C, pooled_height, pooled_width), got %s" % (tuple(grad.shape),))
    check(rois.dim() == 2 and rois.size(1) == 5, op, "rois must be (N, 5), got %s" % (tuple(rois.shape),))
    check(tuple(grad.shape) == (rois.size(0), xdiff_shape[1], pooled_height, pooled_width), op,
          "grad must be (N, C, pooled_height, pooled_width) = %s, got %s"
          % ((rois.size(0), xdiff_shape[1], pooled_height, pooled_width), tuple(grad.shape)))
    check(mode in (0, 1, 2, 3), op, "roi_end_mode must be 0, 1, 2 or 3, got %d" % mode)
    check(sample_num >= 0, op, "sample_num must be >= 0, got %d" % sample_num)


def _roi_alignbk_fake(self, rois, xdiff_shape, pooled_width, pooled_height, spatial_scale, sample_num,
                      roi_end_mode=None):
    mode = _ROI_END_MODE_DEFAULT if roi_end_mode is None else roi_end_mode
    _roi_alignbk_checks(self, rois, xdiff_shape, pooled_width, pooled_height, sample_num, mode)
    return self.new_empty(tuple(xdiff_shape))


@opaque("npu_roi_alignbk", _roi_alignbk_fake)
def npu_roi_alignbk(self, rois, xdiff_shape, pooled_width, pooled_height, spatial_scale, sample_num,
                    roi_end_mode=None):
    """Gradient of npu_roi_align's features (see the module docstring); ``self`` is the
    (N, C, pooled_height, pooled_width) gradient of the pooled output."""
    op = "npu_roi_alignbk"
    mode = _ROI_END_MODE_DEFAULT if roi_end_mode is None else roi_end_mode
    _roi_alignbk_checks(self, rois, xdiff_shape, pooled_width, pooled_height, sample_num, mode)
    b, c, h, w = (int(v) for v in xdiff_shape)
    dtype = torch.float64 if self.dtype == torch.float64 else torch.float32
    xdiff = torch.zeros((b, c, h * w), dtype=dtype, device=self.device)
    grad = self.to(dtype)
    for r, row in enumerate(rois.detach().double().cpu().tolist()):
        bi = int(row[0])
        check(0 <= bi < b, op, "roi batch index %d out of range for %d images" % (bi, b))
        x1, y1, rw, rh = _roi_box(row[1:], spatial_scale, mode)
        gh = sample_num if sample_num > 0 else max(1, math.ceil(rh / pooled_height))
        gw = sample_num if sample_num > 0 else max(1, math.ceil(rw / pooled_width))
        yl, yh, wy0, wy1, vy = _axis(y1, rh, pooled_height, gh, h, self.device, dtype)
        xl, xh, wx0, wx1, vx = _axis(x1, rw, pooled_width, gw, w, self.device, dtype)
        # each sample (bin-major, as the forward reshapes them) receives its bin's share
        per_sample = grad[r].repeat_interleave(gh, dim=1).repeat_interleave(gw, dim=2) / (gh * gw)
        per_sample = per_sample * (vy[:, None] & vx[None, :]).to(dtype)
        for ys, wy in ((yl, wy0), (yh, wy1)):
            for xs, wx in ((xl, wx0), (xh, wx1)):
                flat = (ys[:, None] * w + xs[None, :]).reshape(-1)
                xdiff[bi].index_add_(1, flat, (per_sample * (wy[:, None] * wx[None, :])).reshape(c, -1))
    return xdiff.reshape(b, c, h, w).to(self.dtype)
