"""Drafting the NNX port of a Linen model: `lb.port.draft` writes the source, then checks it.

`draft(linen_module, *sample_args, **sample_kwargs)` reads the Linen classes' source, rewrites
them into idiomatic NNX (libcst, the `port` extra), builds the port, converts the Linen
variables into it and compares it with Linen on every given call. `Draft.report()` lists each
change and each TODO and ends with the measured verdict.
"""

from ._port.draft import Draft as Draft
from ._port.draft import draft as draft
from ._port.errors import PortError as PortError
from ._port.records import Call as Call
from ._port.records import Change as Change
from ._port.records import Check as Check
from ._port.records import PortOf as PortOf
from ._port.records import Todo as Todo

__all__ = ["Call", "Change", "Check", "Draft", "PortError", "PortOf", "Todo", "draft"]
