"""edged: an inference daemon for Jetson-class edge devices.

The import root holds only the exception tree (`edged.errors`), the version and the offline tools' progress
lines with an ETA (`edged.progress`, shared by quantize and deploy); the product's parts are
`edged.daemon`, `edged.models`, `edged.quantize`, `edged.deploy` and the `edged` command, `edged.cli`
(DESIGN.md §1).
"""

__version__ = "0.1.0"
