"""Reusable test helpers: loopback receivers (receivers.py) and their pytest fixtures (fixtures.py)."""
