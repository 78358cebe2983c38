"""Tracing the Linen model: settings located in its fields, and the symbolic trace that writes
each width as an expression of them (`symbolic.py`)."""
