"""torchair.core: shared utilities (the ``torchair`` logger)."""
__all__ = []
