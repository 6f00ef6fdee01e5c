"""edged.daemon"""
