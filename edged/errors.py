"""The one exception tree of edged.

    EdgedError                      anything edged raises on purpose; has a short `code`
    ├── ConfigError                 a config file or override is invalid; names the key path and file
    ├── CaptureError                a camera URI cannot be opened or is not supported here
    ├── BackendError                an inference backend is unavailable or failed
    │   ├── EngineLoadError         the model file cannot be loaded (missing, corrupt, wrong shape)
    │   └── InferenceError          a batch failed to run
    ├── DecoderError                a decoder does not fit the model's outputs
    ├── PublishError                MQTT publishing failed in a way the caller must see
    ├── PackageError                a model package is malformed or fails verification (`code` says which)
    ├── FetchError                  a demo asset could not be fetched or failed its pinned hash
    ├── QuantizeError               quantizing or building an engine failed, or its accuracy gate did
    ├── SwapError                   a model swap was refused or failed
    └── StateDirError               the state directory cannot be written, or another edged holds its lock

Third-party exceptions are translated at the boundary: ``raise EngineLoadError(...) from exc``.
Programmer errors stay ``ValueError`` / ``TypeError``.
"""

from __future__ import annotations


class EdgedError(Exception):
    """Base of every error edged raises on purpose."""

    code = "error"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class ConfigError(EdgedError):
    code = "config_invalid"


class CaptureError(EdgedError):
    code = "capture_failed"


class BackendError(EdgedError):
    code = "backend_unavailable"


class EngineLoadError(BackendError):
    code = "model_load_failed"


class InferenceError(BackendError):
    code = "inference_failed"


class DecoderError(EdgedError):
    code = "decoder_mismatch"


class PublishError(EdgedError):
    code = "publish_failed"


class PackageError(EdgedError):
    code = "package_invalid"


class FetchError(EdgedError):
    code = "fetch_failed"


class QuantizeError(EdgedError):
    code = "quantize_failed"


class SwapError(EdgedError):
    code = "swap_failed"


class StateDirError(EdgedError):
    """Not the model's fault: a start that fails with it is never counted against a model on probation."""

    code = "state_dir_unwritable"
