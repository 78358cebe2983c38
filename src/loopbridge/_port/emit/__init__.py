"""Drafting's fourth stage: the port's text (each construction, the rewritten methods and
`__init__`, the TODO blocks) and the importable module that holds the drafted classes."""
