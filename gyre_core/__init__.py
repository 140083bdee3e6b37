"""Gyre's engine: pure Python + torch. Nothing below this package imports Django."""

__version__ = "0.1.0"
