"""Rotary position embedding ops: npu_rotary_mul, npu_apply_rotary_pos_emb, npu_mrope, npu_interleave_rope."""
