"""Backends that run one direction of one recurrent layer (see dispatch.py)."""
