"""``torchair.core.utils.logger``: the logger named ``torchair``."""
import logging

__all__ = []

logger = logging.getLogger("torchair")
