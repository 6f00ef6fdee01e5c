"""edged.daemon: the on-device runtime, in wings (config, capture, scene, delivery, lifecycle, host, backends,
decoders) under the top-level modules that read them all; the map is docs/architecture.md."""
