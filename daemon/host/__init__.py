"""The host: the machine and the init system under the daemon.

What the daemon reads of the board (sensors), how it acts on it (the governor's levels, a dedicated core),
and how it speaks to systemd, from the first moment of ``edged run`` to the last ``STOPPING=1``.

    governor.py     every ``interval_s``: thermals, power and memory read and acted on (frame rate, pause,
                    the memory budget of a swap), with hysteresis and a minimum dwell
    sensors.py      thermal zones, power rails, GPU load, power mode and memory, across Jetson generations
                    (read under a root: ``/`` on a device, a fixture tree in tests)
    affinity.py     ``inference.dedicated_core``: a CPU core for the inference thread alone
    systemd.py      sd_notify (READY, STATUS, WATCHDOG, STOPPING) and journald logging
    startup.py      before the model loads: signals from the first moment, one daemon per state directory
    extras.py       the optional installs (ONNX Runtime, OpenCV) and the fix when one is missing
"""
