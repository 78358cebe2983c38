"""Drafting's first stage: what the source cannot tell, read from Linen itself (the abstract
`init` per call to port, and the other configurations whose traces tell a class's widths from
one instance's numbers)."""
