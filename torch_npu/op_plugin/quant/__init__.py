"""Quantisation ops: quantize / dequantize, dynamic (block, group, MX) quantisation, quantised matmuls and conv, int4 packing, quantised scatter, SwiGLU + quant, and meta-only quantisation ops."""
