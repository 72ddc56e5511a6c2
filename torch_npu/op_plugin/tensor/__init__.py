"""Tensor ops: storage formats, dtype casts, copies, views, reshapes, pads, indexing, transposes and the shape-level ops."""
