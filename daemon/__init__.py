"""edged.daemon: the on-device runtime (config, capture, preprocessing, backends, decoders, publishing)."""
