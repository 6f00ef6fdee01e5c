"""edged.quantize: offline tools (ONNX -> INT8 QDQ / FP16, accuracy reports, TensorRT engine builds).

Empty so far; the device runtime never imports it.
"""
