"""KV-cache ops: paged KV-cache scatter/gather, KV / QKV RMSNorm + RoPE + cache updates, logits sampling (top-k / top-p), and the meta-only runtime ops of the serving stack."""
