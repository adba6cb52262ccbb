"""partialfc: identity-embedding training at the scale of millions of classes, measured honestly."""

__version__ = "0.1.0"
