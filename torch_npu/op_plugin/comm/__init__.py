"""Matmuls fused with a collective (MC2 ops) and all-to-all grouped matmuls: the matmul runs locally, the exchange over torch.distributed."""
