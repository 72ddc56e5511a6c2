"""Mixture-of-experts ops: gating top-k, init / finalize / re-routing, token permute / unpermute (+ grads), grouped matmuls, FFN, expert-token counts, and meta-only dispatch / combine ops."""
