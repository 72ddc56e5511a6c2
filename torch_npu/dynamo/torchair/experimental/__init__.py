"""torchair.experimental."""
__all__ = []
