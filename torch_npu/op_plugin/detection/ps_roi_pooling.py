"""npu_ps_roi_pooling (+ npu_ps_roi_pooling_backward): position-sensitive RoI average pooling (R-FCN).

Rule of torch_npu's test golden (test_npu_ps_roi_pooling): ``rois`` (B, 5, R), each column
``batch_index, x1, y1, x2, y2``; output (B * R, output_dim, group_size, group_size), RoIs in
``rois.transpose(1, 2).reshape(-1, 5)`` order. For RoI r and bin (ph, pw) of output channel ctop:

    start = round(x1|y1) * spatial_scale,  end = round(x2|y2 + 1) * spatial_scale
    size = max(end - start, 0.1),  bin = size / group_size
    h in [trunc(ph * bin_h + start_h), ceil((ph + 1) * bin_h + start_h)) clamped to [0, H]
    w in [floor(pw * bin_w + start_w), ceil((pw + 1) * bin_w + start_w)) clamped to [0, W]
    out = mean of input[batch_index, (ctop * group_size + ph) * group_size + pw, h, w] (0 if empty)

Bin limits are computed in float32 from the RoIs, as the golden does. Sums come from a
float64 summed-area table, so every bin costs four gathers; the op is made of tensor ops,
hence differentiable and shape-only under Meta/FakeTensor. The backward op spreads
``grad / area`` uniformly over each bin (the adjoint of the same table).
"""
import torch

from torch_npu.op_plugin._common import check
from torch_npu.op_plugin._registry import impl

__all__ = []


def _bins(op, rois, spatial_scale, group_size, output_dim, n, c, h, w):
    """Flat indices of the four summed-area-table corners of every bin, and the bin areas."""
    check(rois.dim() == 3 and rois.size(1) == 5, op, "rois must be (B, 5, R), got %s", (tuple(rois.shape),))
    check(group_size > 0 and output_dim > 0, op, "group_size and output_dim must be positive")
    check(c == output_dim * group_size * group_size, op, "input channels must be output_dim * group_size^2 = %d, got %d",
          (output_dim * group_size * group_size, c))
    g = group_size
    r = rois.detach().transpose(1, 2).reshape(-1, 5)
    r = r.double() if r.dtype == torch.float64 else r.float()
    batch = r[:, 0].long().clamp(0, n - 1)
    start_w, start_h = torch.round(r[:, 1]) * spatial_scale, torch.round(r[:, 2]) * spatial_scale
    end_w, end_h = torch.round(r[:, 3] + 1.0) * spatial_scale, torch.round(r[:, 4] + 1.0) * spatial_scale
    bin_h = torch.clamp_min(end_h - start_h, 0.1) / g
    bin_w = torch.clamp_min(end_w - start_w, 0.1) / g
    p = torch.arange(g, device=rois.device, dtype=r.dtype)
    hs = torch.trunc(p * bin_h[:, None] + start_h[:, None]).long().clamp(0, h)       # (R', g)
    he = torch.ceil((p + 1) * bin_h[:, None] + start_h[:, None]).long().clamp(0, h)
    ws = torch.floor(p * bin_w[:, None] + start_w[:, None]).long().clamp(0, w)
    we = torch.ceil((p + 1) * bin_w[:, None] + start_w[:, None]).long().clamp(0, w)
    ctop = torch.arange(output_dim, device=rois.device)
    chan = (ctop[:, None, None] * g + p.long()[None, :, None]) * g + p.long()[None, None, :]   # (D, g, g)
    plane = (batch[:, None, None, None] * c + chan[None]) * (h + 1)                            # (R', D, g, g)
    hs, he = hs[:, None, :, None], he[:, None, :, None]
    ws, we = ws[:, None, None, :], we[:, None, None, :]

    def at(hh, ww):
        return ((plane + hh) * (w + 1) + ww).reshape(-1)
    area = ((he - hs).clamp_min(0) * (we - ws).clamp_min(0)).expand(plane.shape)
    return (at(he, we), at(hs, we), at(he, ws), at(hs, ws)), area, plane.shape


@impl("npu_ps_roi_pooling")
def npu_ps_roi_pooling(self, rois, spatial_scale, group_size, output_dim):
    """Position-sensitive RoI average pooling, output (B * R, output_dim, group_size, group_size)
    (bin rule in the module doc)."""
    op = "npu_ps_roi_pooling"
    check(self.dim() == 4, op, "input must be NCHW")
    n, c, h, w = self.shape
    (i_ee, i_se, i_es, i_ss), area, shape = _bins(op, rois, spatial_scale, group_size, output_dim, n, c, h, w)
    x = self.double()
    sat = torch.nn.functional.pad(x.cumsum(2).cumsum(3), (1, 0, 1, 0)).reshape(-1)      # summed-area table
    total = sat[i_ee] - sat[i_se] - sat[i_es] + sat[i_ss]
    areaf = area.reshape(-1).to(total.dtype)
    out = torch.where(areaf > 0, total / areaf.clamp_min(1), torch.zeros_like(total))
    return out.reshape(shape).to(self.dtype)


@impl("npu_ps_roi_pooling_backward")
def npu_ps_roi_pooling_backward(output_grad, rois, spatial_scale, group_size, output_dim, input_size):
    """Gradient of npu_ps_roi_pooling with respect to its input of shape ``input_size``."""
    op = "npu_ps_roi_pooling_backward"
    n, c, h, w = (int(s) for s in input_size)
    (i_ee, i_se, i_es, i_ss), area, shape = _bins(op, rois, spatial_scale, group_size, output_dim, n, c, h, w)
    check(tuple(output_grad.shape) == tuple(shape), op, "output_grad must be %s, got %s",
          (tuple(shape), tuple(output_grad.shape)))
    areaf = area.reshape(-1).double()
    gbin = torch.where(areaf > 0, output_grad.reshape(-1).double() / areaf.clamp_min(1), torch.zeros_like(areaf))
    d_sat = torch.zeros(n * c * (h + 1) * (w + 1), dtype=torch.float64, device=output_grad.device)
    d_sat = (d_sat.index_add(0, i_ee, gbin).index_add(0, i_se, -gbin)
             .index_add(0, i_es, -gbin).index_add(0, i_ss, gbin)).reshape(n, c, h + 1, w + 1)
    # adjoint of the padded double cumsum: suffix sums, then drop the pad row / column
    grad = d_sat.flip(2).cumsum(2).flip(2).flip(3).cumsum(3).flip(3)[:, :, 1:, 1:]
    return grad.to(output_grad.dtype)
