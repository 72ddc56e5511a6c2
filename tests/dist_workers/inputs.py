"""Deterministic per-rank inputs, shared by the workers and the tests' references.

``value(rank, shape, dtype, salt)`` is what rank ``rank`` feeds a collective;
the parent test calls the same function to build its single-process reference.
Values are small integers (exact in every float dtype and under sums/products
over 4 ranks) unless ``exact=False``.
"""
import torch


def value(rank, shape, dtype=torch.float32, salt=0, exact=True):
    n = 1
    for s in shape:
        n *= s
    base = torch.arange(n, dtype=torch.float64).reshape(shape)
    if exact:
        # 1..5, different per rank and position (products stay tiny and exact)
        t = (base * 7 + rank * 3 + salt * 5) % 5 + 1
    else:
        t = torch.sin(base * 0.37 + rank * 1.3 + salt * 0.11)
    return t.to(dtype)


def ints(rank, shape, salt=0):
    """int32 bit patterns for BAND/BOR/BXOR."""
    n = 1
    for s in shape:
        n *= s
    base = torch.arange(n, dtype=torch.int64).reshape(shape)
    return ((base * 2654435761 + rank * 40503 + salt * 97) % 1024).to(torch.int32)
