"""Serving-runtime ops (meta-only): attention-FFN disaggregation workers and model obfuscation."""
