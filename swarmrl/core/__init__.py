"""The ground floor: config bases, log setup, run directories. It imports no service, client or
command; they import it, never the reverse (`tests/unit/test_layers.py`).
"""
