"""torchair.patterns: user FX pattern replacements."""
__all__ = []
