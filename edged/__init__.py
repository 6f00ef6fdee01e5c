"""edged: an inference daemon for Jetson-class edge devices.

The import root holds only the CLI and the exception tree; the product's parts are
`edged.daemon`, `edged.models`, `edged.quantize` and `edged.deploy` (DESIGN.md §1).
"""

__version__ = "0.1.0"
