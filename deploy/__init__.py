"""edged.deploy"""
