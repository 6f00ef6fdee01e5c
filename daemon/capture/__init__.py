"""Capture: cameras in, model-sized rows out, one thread per camera (docs/architecture.md, "A frame's path").

A camera's URI names its source type; the type's row in the registry says how it is checked, opened off
GStreamer, planned as a GStreamer pipeline, probed and reported by ``edged doctor``. The camera thread
reads frames from the source, refuses oversized ones before decoding, preprocesses each into a
preallocated row and leaves it in a latest-frame-wins slot for the gather thread (daemon/inference.py).
A source that fails is reopened with backoff; a camera that is down never holds up the others.

    camera.py       the camera thread: open, read, preprocess into latest-frame-wins slots, reconnect
    registry.py     the source types, one row per scheme family; the scheme sets derive from it
    source.py       what a source is: `Source`, `Opening` (what an opener gets), `with_password`
    sources.py      a URI opened as a `Source`: the path (GStreamer or the row's opener), and the first
                    types' openers (OpenCV, edged's MJPEG reader, synthetic)
    snapshot.py     snapshot+http(s):// cameras: a JPEG polled at ``fps_max``
    netcam.py       network cameras that cannot hold each other up: MJPEG read here, servers answered
                    before FFmpeg opens them
    uri.py          the camera-URI grammar of both capture paths, and each URI's GStreamer pipeline
    framebound.py   a frame's size from its JPEG header; ``max_frame_pixels`` checked before decoding
    redact.py       camera credentials never leave the device: URIs and free text with user and password
                    replaced (the config reads it too)
    preprocess.py   a frame into one row of the model's input (letterbox / stretch, colour, scale, layout)
    motion.py       the motion gate the gather thread applies, and the scene-cut detector
    probe.py        ``edged check-config --probe-cameras``: each camera opened once and described
    encoded.py      the encoded ring of a camera with ``record:``: its H.264/H.265 packets (keyframes flagged, wall
                    times), bounded by bytes and seconds, in segments (one per open); spans clips are cut from
    gstreamer/      the GStreamer capture path (PyGObject, appsink; hardware decode and scaling on Jetson)

Nothing here imports GStreamer at import time, and the modules the config loader reads (``uri``,
``framebound``, ``registry``, ``source``, ``snapshot``, ``redact``) import no OpenCV either; ``encoded`` imports
neither (daemon/record/ reads it).
"""
