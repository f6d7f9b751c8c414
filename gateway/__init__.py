"""polygate: a multi-protocol log gateway."""

__version__ = "0.1.0"
