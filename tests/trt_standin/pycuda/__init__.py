"""A stand-in for pycuda (see ../README.md)."""

VERSION_TEXT = "stand-in"
