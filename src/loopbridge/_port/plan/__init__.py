"""Drafting's second stage: what the port builds, read from the class's source and the trace
(its sites, the attributes `__init__` builds and their values, widths and setup lists)."""
