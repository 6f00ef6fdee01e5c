"""Evidence kept on the device: video clips around events, and the frames worth labelling, each in a
bounded store under the state directory, listed and fetched through the local HTTP server, and uploaded
by HTTP PUT to a configured endpoint.

    mux.py          a span of a camera's encoded ring (capture/encoded.py) into one MP4, atomically, no re-encode
    planner.py      events to clips: spans opened, merged and closed by object events, cut from the ring and
                    written on the planner's own thread (``clips``); ``clip_ready`` events; uploads queued
    store.py        the clip store: MP4 + sidecar per clip, bounded by bytes and age, tidied at the start;
                    the ``/clips`` paths of the health server
    labelling.py    the frames worth labelling: JPEGs and one COCO JSON, bounded by count and bytes
    build.py        the parts above as app.py builds them from the config (labelling, the /clips paths)
"""
