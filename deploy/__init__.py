"""edged.deploy: bundles, certificates, and the OTA push client (`edged push`).

The device runtime never imports it.
"""
