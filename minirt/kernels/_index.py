"""placeholder"""
INDEX = {}
