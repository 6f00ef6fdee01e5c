"""A stand-in for cuda-bindings (see ../../README.md)."""

__version__ = "stand-in"
