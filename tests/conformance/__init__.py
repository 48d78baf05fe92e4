"""Conformance vectors (``protocols/vectors/*.json``) run against a live server: see ``runner.py``."""
