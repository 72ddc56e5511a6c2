"""Normalisation ops: RMSNorm / LayerNorm variants (add, deep, gemma, cast), norms fused with quantisation, group norm + swish."""
