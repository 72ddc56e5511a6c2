"""Convolution ops: npu_conv2d / npu_convolution (+ transposed, + backward ops), deformable conv2d, fused and masked causal conv1d."""
