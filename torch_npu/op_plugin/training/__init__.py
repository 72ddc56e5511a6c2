"""Training ops: losses (+ backward), optimizer steps (Adam, AdamW, BertAdam), dropout masks and float-status checks."""
