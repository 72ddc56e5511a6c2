"""Activation ops: GELU / fast GELU, SwiGLU / GeGLU, SiLU, Mish (+ backward), clipped SwiGLU, scaled masked softmax."""
