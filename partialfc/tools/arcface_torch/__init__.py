"""Bring an arcface_torch setup in: backbone weights and config files."""
