"""edged.deploy: bundles, the OTA push client and signing keys.

Empty so far; the device runtime never imports it.
"""
