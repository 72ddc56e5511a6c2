"""FFT backward ops: ``fft_c2r_backward`` / ``fft_r2c_backward`` (PyTorch's formulas for
``_fft_c2r`` / ``_fft_r2c``).

``stft_backward`` is meta-only (which framing the npu stft uses - centre padding, pad mode - is
not in its schema or docs); its Meta kernel gives the gradient's shape, ``self``'s.
"""
import torch

from torch_npu.op_plugin._registry import impl, meta

__all__ = []


@impl("fft_c2r_backward")
def fft_c2r_backward(grad, dim, normalization):
    """Gradient of the one-sided complex-to-real FFT ``_fft_c2r(x, dim, normalization, n)``:
    the one-sided real-to-complex FFT of ``grad`` with the bins that conjugate symmetry folds
    (indices ``1 .. n - n//2 - 1`` of the last dim) doubled."""
    g = torch.ops.aten._fft_r2c(grad, list(dim), normalization, True)
    last = dim[-1]
    double_length = grad.shape[last] - g.shape[last]
    if double_length > 0:
        scale = torch.ones(g.shape[last], dtype=grad.dtype, device=grad.device)
        scale[1:1 + double_length] = 2
        shape = [1] * g.dim()
        shape[last] = g.shape[last]
        g = g * scale.reshape(shape)
    return g


@impl("fft_r2c_backward")
def fft_r2c_backward(grad, dim, normalization, onesided, last_dim_size):
    """Gradient of the real-to-complex FFT ``_fft_r2c(x, dim, normalization, onesided)``: the real
    part of the inverse complex FFT of ``grad``, zero-padded back to ``last_dim_size`` along the
    last transformed dim when ``onesided``."""
    full = grad
    if onesided:
        last = dim[-1] % grad.dim()
        pad = last_dim_size - grad.shape[last]
        if pad > 0:
            shape = list(grad.shape)
            shape[last] = pad
            full = torch.cat([grad, grad.new_zeros(shape)], dim=last)
    return torch.real(torch.ops.aten._fft_c2c(full, list(dim), normalization, False))


@meta("stft_backward")
def stft_backward_meta(grad_output, self, n_fft, hop_length=None, win_length=None, window=None,
                       normalized=False, onesided=None, return_complex=None):
    """The gradient of ``stft`` w.r.t. its real input has the input's shape and dtype."""
    return torch.empty_like(self)
