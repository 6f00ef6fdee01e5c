"""The scene: what each camera's detections mean, on the decode thread (daemon/inference.py's sink).

    decode thread ──Result──> Scenes.process ──> (Result with track ids and zones, object events)

Per camera: its detection settings and masks filter the detections, the tracker continues tracks, zones
say where each box stands, and a track entering, leaving or changing zones, or crossing a line, is an object
event.

    scenes.py       per camera: settings, masks, the tracker, zones, and the object events they give
    tracker.py      a ByteTrack-style multi-object tracker (greedy IoU, confident detections first)
    zones.py        named polygons and masks, and which of them a box's anchor point is in
    lines.py        named lines with a direction, and a track's anchor point crossing one (in or out)
    draw.py         detections drawn onto a frame, for snapshots and ``edged watch --snapshot``
"""
