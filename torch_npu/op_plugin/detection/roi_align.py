"""npu_roi_align: RoIAlign of Faster R-CNN (average of bilinear samples per output bin).

The RoI boxes are read on the host, so the op is registered opaque (one node under
torch.compile, running this kernel at run time; the fake kernel gives the output shape).
Its gradient in the features is npu_roi_alignbk (RoIAlign's adjoint, itself opaque), so a
compiled training step keeps both directions as single graph nodes; the boxes get none.

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

from torch_npu.op_plugin._common import acc, check
from torch_npu.op_plugin._registry import _library, opaque

__all__ = []


def _roi_box(roi, spatial_scale, mode):
    """(x1, y1, x2, y2, roi_w, roi_h) in feature coordinates for ``roi_end_mode``:
    0 scaled corners, size clamped to >= 1 (torchvision ``aligned=False``);
    1 the end extended by ``spatial_scale`` (TF SAME), size >= 1;
    2 corners shifted by -0.5, size unclamped (torchvision ``aligned=True``);
    3 corners shifted by -0.5, size >= 1 (MMDetection)."""
    x1, y1, x2, y2 = (v * spatial_scale for v in roi)
    if mode == 1:
        x2, y2 = x2 + spatial_scale, y2 + spatial_scale
    elif mode in (2, 3):
        x1, y1, x2, y2 = x1 - 0.5, y1 - 0.5, x2 - 0.5, y2 - 0.5
    w, h = x2 - x1, y2 - y1
    if mode != 2:
        w, h = max(w, 1.0), max(h, 1.0)
    return x1, y1, w, h


def _axis(start, size, pooled, grid, limit, device, dtype):
    """Sample coordinates along one axis, their low/high neighbours, weights and validity."""
    bins = torch.arange(pooled, device=device, dtype=dtype).unsqueeze(1)
    sub = (torch.arange(grid, device=device, dtype=dtype) + 0.5).unsqueeze(0)
    pos = (start + bins * (size / pooled) + sub * (size / pooled / grid)).reshape(-1)
    valid = (pos >= -1.0) & (pos <= limit)
    pos = pos.clamp_min(0)
    low = pos.floor().long()
    edge = low >= limit - 1
    low = torch.where(edge, torch.full_like(low, limit - 1), low)
    high = torch.where(edge, low, low + 1)
    pos = torch.where(edge, low.to(dtype), pos)
    frac = pos - low.to(dtype)
    return low, high, 1 - frac, frac, valid


def _check_args(self, rois, pooled_height, pooled_width, sample_num, roi_end_mode):
    op = "npu_roi_align"
    check(self.dim() == 4, op, "features must be (B, C, H, W), got %s", (tuple(self.shape),))
    check(rois.dim() == 2 and rois.size(1) == 5, op, "rois must be (N, 5), got %s", (tuple(rois.shape),))
    check(roi_end_mode in (0, 1, 2, 3), op, "roi_end_mode must be 0, 1, 2 or 3, got %d", roi_end_mode)
    check(pooled_height > 0 and pooled_width > 0 and sample_num >= 0, op, "pooled sizes must be > 0, sample_num >= 0")


def _roi_align_fake(self, rois, spatial_scale, pooled_height, pooled_width, sample_num, roi_end_mode):
    _check_args(self, rois, pooled_height, pooled_width, sample_num, roi_end_mode)
    return self.new_empty((rois.size(0), self.size(1), pooled_height, pooled_width))


@opaque("npu_roi_align", fake=_roi_align_fake)
def npu_roi_align(self, rois, spatial_scale, pooled_height, pooled_width, sample_num, roi_end_mode):
    """RoIAlign. ``self`` is (B, C, H, W); each row of ``rois`` (N, 5) is
    ``[batch_index, x1, y1, x2, y2]`` in image coordinates, mapped to the feature map by
    ``spatial_scale`` with the ``roi_end_mode`` convention (0: torchvision ``aligned=False``;
    1: end extended by ``spatial_scale``; 2: torchvision ``aligned=True``; 3: -0.5 shift with
    sizes clamped to >= 1). Each of the ``pooled_height x pooled_width`` bins averages a
    ``sample_num x sample_num`` grid (``ceil(roi_size / pooled)`` per axis when 0) of bilinear
    samples at the sub-cell centres; samples beyond one pixel outside the map count as 0.
    Output (N, C, pooled_height, pooled_width). Differentiable in ``self``."""
    op = "npu_roi_align"
    _check_args(self, rois, pooled_height, pooled_width, sample_num, roi_end_mode)
    b, c, h, w = self.shape
    feats = acc(self)
    dtype = feats.dtype if feats.dtype == torch.float64 else torch.float32
    outs = []
    for row in rois.detach().double().cpu().tolist():
        bi = int(row[0])
        check(0 <= bi < b, op, "roi batch index %d out of range for %d images", (bi, b))
        x1, y1, rw, rh = _roi_box(row[1:], spatial_scale, roi_end_mode)
        gh = sample_num if sample_num > 0 else max(1, math.ceil(rh / pooled_height))
        gw = sample_num if sample_num > 0 else max(1, math.ceil(rw / pooled_width))
        yl, yh, wy0, wy1, vy = _axis(y1, rh, pooled_height, gh, h, self.device, dtype)
        xl, xh, wx0, wx1, vx = _axis(x1, rw, pooled_width, gw, w, self.device, dtype)
        f = feats[bi].to(dtype)  # (C, H, W)
        val = (f[:, yl][:, :, xl] * (wy0[:, None] * wx0[None, :])
               + f[:, yl][:, :, xh] * (wy0[:, None] * wx1[None, :])
               + f[:, yh][:, :, xl] * (wy1[:, None] * wx0[None, :])
               + f[:, yh][:, :, xh] * (wy1[:, None] * wx1[None, :]))
        val = val * (vy[:, None] & vx[None, :]).to(dtype)
        val = val.reshape(c, pooled_height, gh, pooled_width, gw).sum((2, 4)) / (gh * gw)
        outs.append(val)
    if not outs:
        return self.new_empty((0, c, pooled_height, pooled_width))
    return torch.stack(outs).to(self.dtype)


def _setup_context(ctx, inputs, output):
    self, rois, spatial_scale, pooled_height, pooled_width, sample_num, roi_end_mode = inputs
    ctx.save_for_backward(rois)
    ctx.args = (list(self.shape), pooled_width, pooled_height, spatial_scale, sample_num, roi_end_mode)


def _backward(ctx, grad):
    rois, = ctx.saved_tensors
    if not ctx.needs_input_grad[0]:
        return None, None, None, None, None, None, None
    xdiff_shape, pooled_width, pooled_height, spatial_scale, sample_num, mode = ctx.args
    dx = torch.ops.npu.npu_roi_alignbk(grad.contiguous(), rois, xdiff_shape, pooled_width, pooled_height,
                                       spatial_scale, sample_num, mode)
    return dx, None, None, None, None, None, None


torch.library.register_autograd("npu::npu_roi_align", _backward, setup_context=_setup_context, lib=_library())


# roi_end_mode when the argument is None (op-plugin's aclnnROIAlignBackward call)
_ROI_END_MODE_DEFAULT = 1


def _roi_alignbk_checks(grad, rois, xdiff_shape, pooled_width, pooled_height, sample_num, mode):
    op = "npu_roi_alignbk"
    check(len(xdiff_shape) == 4, op, "xdiff_shape must be (B, C, H, W), got %s", (list(xdiff_shape),))
    check(grad.dim() == 4, op, "grad must be (N, C, pooled_height, pooled_width), got %s", (tuple(grad.shape),))
    check(rois.dim() == 2 and rois.size(1) == 5, op, "rois must be (N, 5), got %s", (tuple(rois.shape),))
    check(tuple(grad.shape) == (rois.size(0), xdiff_shape[1], pooled_height, pooled_width), op,
          "grad must be (N, C, pooled_height, pooled_width) = %s, got %s",
          ((rois.size(0), xdiff_shape[1], pooled_height, pooled_width), tuple(grad.shape)))
    check(mode in (0, 1, 2, 3), op, "roi_end_mode must be 0, 1, 2 or 3, got %d", mode)
    check(sample_num >= 0, op, "sample_num must be >= 0, got %d", sample_num)


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
        check(0 <= bi < b, op, "roi batch index %d out of range for %d images", (bi, b))
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
