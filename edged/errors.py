"""The one exception tree of edged, and the one list of error codes (`Code`).

    EdgedError                      anything edged raises on purpose; has a `code` (a `Code` member)
    ├── ConfigError                 a config file or override is invalid; names the key path and file
    ├── CaptureError                a camera URI cannot be opened or is not supported here
    ├── BackendError                an inference backend is unavailable or failed
    │   ├── EngineLoadError         the model file cannot be loaded (missing, corrupt, wrong shape)
    │   └── InferenceError          a batch failed to run
    ├── DecoderError                a decoder does not fit the model's outputs
    ├── PublishError                MQTT publishing failed in a way the caller must see
    │   └── SpoolError              the spool's storage failed (daemon/delivery/spool/__init__.py)
    │       └── SpoolCorrupt        the spool file is not a database, or a malformed one
    ├── PackageError                a model package is malformed or fails verification (`code` says which)
    │   └── IncompatibleEngine      an engine built for another TensorRT, GPU or L4T (models/compat.py)
    ├── CommandError                an MQTT command was refused; its `code` goes into the reply
    ├── ProtocolError               a message breaks the wire contract (a malformed OTA chunk)
    ├── FetchError                  a demo asset could not be fetched or failed its pinned hash
    ├── QuantizeError               quantizing or building an engine failed, or its accuracy gate did
    ├── SwapError                   a model swap was refused or failed
    ├── StateDirError               the state directory cannot be written, or another edged holds its lock
    ├── RecordError                 a clip could not be written from the encoded ring (daemon/record/mux.py)
    ├── CertError                   certificates could not be made (deploy/certs.py)
    ├── BundleError                 a deploy bundle could not be built or installed (deploy/bundle.py)
    └── RolloutError                a rollout's state cannot be used: another package's, aborted, unreadable
                                    (deploy/rollout/state.py)

Two more live here but outside `EdgedError`, because callers tell them apart from it:

    RuntimeError
    └── CudaError                   a CUDA driver call failed (daemon/backends/tensorrt/cuda.py); never leaves the
                                    TensorRT backend: ``api.translate`` turns it into an EngineLoadError,
                                    InferenceError or BackendError with its reason (an EdgedError would be
                                    passed on untranslated)
    Exception
    └── StoppedBeforeStart          not a failure: a stop signal came before the model was opened, and
                                    `edged run` exits 0 without loading it (daemon/host/startup.py)

Every public exception class of edged is defined in this file (tests/test_errors_tree.py holds that and that
this tree names each one under its real base); the modules named above import theirs from here and keep the
name importable. A module's private control-flow exception (a name starting with ``_``, e.g.
``_DuplicateKey`` in the config loader, ``_Retry`` in the OTA download) stays in its module: it never leaves it.

Third-party exceptions are translated at the boundary: ``raise EngineLoadError(...) from exc``.
Programmer errors stay ``ValueError`` / ``TypeError``.

Every code that goes on the wire (a command reply's or an OTA status's ``error.code``, an event's
``code``) or into the journal (``ERROR_CODE=``) is a member of `Code`. It is a ``str`` enum, so JSON
carries the bare string (``"too_large"``) and ``Code("too_large")`` reads one back; ``str()`` and
f-strings give the value too.
"""

from __future__ import annotations

from enum import Enum


class Code(str, Enum):
    """Every error code edged emits, one line each. The value is what the wire and the journal carry."""

    def __str__(self) -> str:
        return str(self.value)

    # --- the exception classes' own codes
    ERROR = "error"  # an EdgedError without a more precise code
    CONFIG_INVALID = "config_invalid"  # a config file or override is invalid
    CAPTURE_FAILED = "capture_failed"  # a camera cannot be opened
    BACKEND_UNAVAILABLE = "backend_unavailable"  # an inference backend is unavailable or failed
    MODEL_LOAD_FAILED = "model_load_failed"  # the model file cannot be loaded by the backend
    INFERENCE_FAILED = "inference_failed"  # a batch failed to run
    DECODER_MISMATCH = "decoder_mismatch"  # the decoder does not fit the model's outputs
    PUBLISH_FAILED = "publish_failed"  # MQTT publishing failed
    SPOOL_FAILED = "spool_failed"  # the spool's storage failed (disk full, I/O error)
    SPOOL_CORRUPT = "spool_corrupt"  # the spool file is not a database, or a malformed one
    PACKAGE_INVALID = "package_invalid"  # a model package is malformed or fails verification
    FETCH_FAILED = "fetch_failed"  # a demo asset could not be fetched or failed its pinned hash
    QUANTIZE_FAILED = "quantize_failed"  # quantizing or building an engine failed
    SWAP_FAILED = "swap_failed"  # a model swap was refused or failed
    STATE_DIR_UNWRITABLE = "state_dir_unwritable"  # the state directory cannot be written
    CERTS_FAILED = "certs_failed"  # certificates could not be made
    BUNDLE_FAILED = "bundle_failed"  # a deploy bundle could not be built or installed
    # --- model packages: verification, one code per failure (DESIGN §5)
    TOO_LARGE = "too_large"  # over a size cap (a manifest, a signature, a command, a file, a snapshot)
    TOO_LONG = "too_long"  # a file is longer than the size its manifest declares
    SIZE_MISMATCH = "size_mismatch"  # a file's size differs from its manifest's
    HASH_MISMATCH = "hash_mismatch"  # a file's sha256 differs from its manifest's
    FILE_MISSING = "file_missing"  # a file the manifest lists is not there
    UNDECLARED_FILE = "undeclared_file"  # a file the manifest does not list
    NOT_A_PACKAGE = "not_a_package"  # neither a package folder nor a package tar
    NOT_FOUND = "not_found"  # no such package, model, file or image
    MANIFEST_INVALID = "manifest_invalid"  # the manifest is not valid JSON or fails its schema
    UNSIGNED = "unsigned"  # no manifest.sig
    BAD_SIGNATURE = "bad_signature"  # the signature is malformed or does not verify
    UNKNOWN_KEY = "unknown_key"  # signed by a key this device does not trust
    KEY_INVALID = "key_invalid"  # a signing or public key file is unreadable or not Ed25519
    KEY_EXISTS = "key_exists"  # refusing to overwrite an existing key
    EXPIRED = "expired"  # a package past its `expires`, or a command past its expiry
    BAD_VERSION = "bad_version"  # this version was rolled back here and is never retried
    OLDER_VERSION = "older_version"  # older than the version installed
    COMPATIBILITY_MISSING = "compatibility_missing"  # an engine without the compatibility it needs
    INCOMPATIBLE = "incompatible"  # an engine built for another TensorRT, GPU or L4T release
    NO_SPACE = "no_space"  # not enough free space to install
    NO_PREVIOUS = "no_previous"  # no previous version to roll back to
    REBATCH_FAILED = "rebatch_failed"  # the graph's batch cannot be set
    BATCH_MISMATCH = "batch_mismatch"  # a batch of the model computes other values than the model one image at a time
    SIGNATURE_MISMATCH = "signature_mismatch"  # the model's inputs/outputs contradict its manifest
    LABELS_MISMATCH = "labels_mismatch"  # labels.txt or the label count contradicts the manifest or the model
    LABELS_INVALID = "labels_invalid"  # labels.txt is unreadable or malformed
    INIT_FAILED = "init_failed"  # `edged model init` cannot make a package of this ONNX export
    # --- swaps and rollbacks (events: model_rejected, model_rolled_back)
    GOLDEN_INVALID = "golden_invalid"  # the package's golden files are unreadable
    GOLDEN_MISMATCH = "golden_mismatch"  # the model's output differs from its golden output
    FOLD_MISMATCH = "fold_mismatch"  # a folded model's outputs differ from the unfolded model's (edged model fold)
    INPUT_CHANGED = "input_changed"  # the model takes another input than the one being served
    OTHER_MODEL = "other_model"  # a package of another model than the one this daemon serves
    ROLLED_BACK = "rolled_back"  # a rollback without a more precise reason
    BY_COMMAND = "by_command"  # rolled back by the `rollback` command
    PROBATION_FAILED = "probation_failed"  # the new model failed its probation
    PROBATION_CRASHES = "probation_crashes"  # the daemon crashed too often on probation: rolled back at start
    CURRENT_CORRUPT = "current_corrupt"  # the current version is corrupt on disk: rolled back at start
    LOAD_FAILED = "load_failed"  # the current version does not load: rolled back at start
    OVER_BUDGET = "over_budget"  # the model does not fit the memory budget
    MODEL_REJECTED = "model_rejected"  # a candidate failed its shadow evaluation's thresholds (protocol/shadow.py)
    NO_EVIDENCE = "no_evidence"  # a shadow evaluation saw too little (dark, empty scene) to judge by its max_s
    LOCKED = "locked"  # another edged holds the state directory's lock
    # --- commands (the reply's error.code)
    EMPTY = "empty"  # an empty payload (what clearing a retained message delivers)
    NOT_UTF8 = "not_utf8"  # the payload is not UTF-8
    INVALID_JSON = "invalid_json"  # the payload is not valid JSON
    DUPLICATE_KEY = "duplicate_key"  # a JSON object with a key twice
    NOT_A_NUMBER = "not_a_number"  # NaN or Infinity in the payload
    TOO_DEEP = "too_deep"  # nested more than 16 levels
    NOT_AN_OBJECT = "not_an_object"  # the payload is not a JSON object
    INVALID_ARGUMENTS = "invalid_arguments"  # the arguments fail the verb's schema
    UNKNOWN_VERB = "unknown_verb"  # no such command
    RETAINED_IGNORED = "retained_ignored"  # a retained command that is not idempotent is not acted on
    BAD_RESPONSE_TOPIC = "bad_response_topic"  # a response topic outside the device's reply topics
    BUSY = "busy"  # too many commands waiting, or another OTA transfer runs
    UNKNOWN_DOCUMENT = "unknown_document"  # diagnose: no document of that id held (expired or replaced): ask again
    FAILED = "failed"  # a command or transfer failed unexpectedly (the message says why)
    NOT_SUPPORTED = "not_supported"  # this daemon cannot do that (no model store, no config file)
    UNKNOWN_CAMERA = "unknown_camera"  # no camera of that name
    RATE_LIMITED = "rate_limited"  # asked again too soon (snapshots)
    NO_FRAME = "no_frame"  # the camera has no frame yet
    NOT_SENT = "not_sent"  # the answer could not be published
    # --- OTA transfers (ota/status error.code)
    STALLED = "stalled"  # the transfer got no chunk for too long
    MALFORMED = "malformed"  # a message that breaks the wire contract (an OTA chunk's framing, say)
    DOWNLOAD_FAILED = "download_failed"  # a package file's HTTP(S) download failed (status, TLS, network)
    NO_TRANSFER = "no_transfer"  # cancel: no transfer runs (or not the one named)
    # --- operator tools
    NO_DEVICES = "no_devices"  # `edged push`: no device to push to
    MIRROR_FAILED = "mirror_failed"  # `edged push --mirror`: the package is not (or not right) on the mirror
    FRAMES_INVALID = "frames_invalid"  # calibration frames or ground truth unreadable
    RECORD_FAILED = "record_failed"  # a clip could not be written from a camera's encoded ring


class EdgedError(Exception):
    """Base of every error edged raises on purpose."""

    code: Code = Code.ERROR
    # the second stage (cascade) whose package failed, when it is one: not the primary model's fault
    stage: str | None = None

    def __init__(self, message: str, *, code: Code | str | None = None) -> None:
        """`code`: a `Code` member or its value (a value that is no member is a programmer error: ValueError)."""
        super().__init__(message)
        if code is not None:
            self.code = Code(code)


class ConfigError(EdgedError):
    code = Code.CONFIG_INVALID


class CaptureError(EdgedError):
    code = Code.CAPTURE_FAILED


class BackendError(EdgedError):
    code = Code.BACKEND_UNAVAILABLE


class EngineLoadError(BackendError):
    code = Code.MODEL_LOAD_FAILED


class InferenceError(BackendError):
    code = Code.INFERENCE_FAILED


class DecoderError(EdgedError):
    code = Code.DECODER_MISMATCH


class PublishError(EdgedError):
    code = Code.PUBLISH_FAILED


class PackageError(EdgedError):
    code = Code.PACKAGE_INVALID


class CommandError(EdgedError):
    """A command refused; `code` and the message go into the reply (``{"ok": false, "error": {...}}``)."""

    code = Code.FAILED

    def __init__(self, code: Code | str, message: str) -> None:
        super().__init__(message, code=code)


class ProtocolError(EdgedError):
    """A message that breaks the wire contract (edged.protocol): dropped, counted, never acted on."""

    code = Code.MALFORMED


class FetchError(EdgedError):
    code = Code.FETCH_FAILED


class QuantizeError(EdgedError):
    code = Code.QUANTIZE_FAILED


class SwapError(EdgedError):
    code = Code.SWAP_FAILED


class StateDirError(EdgedError):
    """Not the model's fault: a start that fails with it is never counted against a model on probation."""

    code = Code.STATE_DIR_UNWRITABLE


class SpoolError(PublishError):
    """The spool's storage failed: disk full, an I/O error, a file that cannot be (re)created."""

    code = Code.SPOOL_FAILED


class SpoolCorrupt(SpoolError):
    """The spool file is not a database, or a malformed one."""

    code = Code.SPOOL_CORRUPT


class IncompatibleEngine(PackageError):
    code = Code.INCOMPATIBLE


class RecordError(EdgedError):
    """A clip could not be written from a camera's encoded ring (no keyframe, a muxer failure, the disk)."""

    code = Code.RECORD_FAILED


class CertError(EdgedError):
    code = Code.CERTS_FAILED


class BundleError(EdgedError):
    code = Code.BUNDLE_FAILED


class RolloutError(EdgedError):
    """A rollout's state cannot be used (another package's, aborted, unreadable)."""


class CudaError(RuntimeError):
    """A CUDA driver call failed; the message names the call and CUDA's reason. Translated at the backend's
    boundary (``api.translate``) into EngineLoadError / InferenceError / BackendError."""


class StoppedBeforeStart(Exception):
    """A stop signal came before the model was opened: `edged run` exits 0 without loading it."""
