"""edged.models"""
