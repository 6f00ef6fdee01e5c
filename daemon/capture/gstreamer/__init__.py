"""The GStreamer capture path: a pipeline per camera ending in an appsink, through PyGObject.

Used where GStreamer loads and the camera's ``backend`` allows (CSI cameras need it; on a Jetson it brings
the hardware decoder and scaler); otherwise a camera opens through ``capture/sources.py``. The pipeline
each URI becomes is planned in ``capture/uri.py``, without importing GStreamer.

    pipeline.py     the pipeline and its appsink: built, started, read, watched on the bus, torn down
    why.py          why a source failed, in one line (bus errors, refused connections, certificates),
                    credentials scrubbed; no GStreamer import
"""
