"""A stand-in for cuda-python's `cuda` namespace (see ../README.md)."""
