"""edged.quantize"""
