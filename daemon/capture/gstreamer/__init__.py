"""The GStreamer capture path: a pipeline per camera ending in an appsink, through PyGObject.

Used where GStreamer loads and the camera's ``backend`` allows (CSI cameras need it; on a Jetson it brings
the hardware decoder and scaler); otherwise a camera opens through ``capture/sources.py``. The pipeline
each URI becomes is planned in ``capture/uri.py``, without importing GStreamer.

    pipeline.py     the pipeline and its appsink: built, started, read, watched on the bus, torn down
    mapping.py      a buffer's memory seen by NumPy without PyGObject's copy (gst_buffer_map through ctypes)
    why.py          why a source failed, in one line (bus errors, refused connections, certificates),
                    credentials scrubbed; no GStreamer import
    tap.py          a recording camera's own H.264/H.265 packets, copied after decodebin's parser into its
                    encoded ring (no re-encode); its decoded frames, by reference, for an encoder (``RawTap``)
    encode.py       other sources' frames (the decoder's, else the camera thread's) encoded once into the ring
                    (nvv4l2h264enc, x264enc, openh264enc); ``RingFeed``: what fills a recording camera's ring
"""
