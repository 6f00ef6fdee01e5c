"""A stand-in for pycuda (see ../README.md)."""
