"""The one name for JSON-shaped data (issue 59): certificates, configs as dicts, summaries,
results, journal lines and ledgers, as ``json.loads`` returns them and ``json.dumps`` takes them.

:data:`JSONValue` is ``Any``, as typeshed types ``json.loads``: the shape of a document read
from disk is checked where it is read (``isinstance``, a DataError or ReleaseError naming the
file), not by mypy. The alias says at each seam that the value is a JSON document, and keeps that
one ``Any`` here instead of at every signature.
"""

from __future__ import annotations

from typing import Any, TypeAlias

#: one value of a JSON document (str, int, float, bool, None, list or dict of them)
JSONValue: TypeAlias = Any
#: a JSON object
JSON: TypeAlias = dict[str, JSONValue]

__all__ = ["JSON", "JSONValue"]
