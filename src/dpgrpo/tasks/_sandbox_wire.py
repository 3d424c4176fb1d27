"""Plain data on the wire between the sandbox's processes: exact builtin values only.

Shared, as text, by the untrusted child (``_sandbox_child.py``), the tests runner
(``_sandbox_tests.py``) and the trusted parent (``sandbox.py``); it imports only ``json`` so that
the children can run it before anything else. A value crosses a process boundary only as JSON
built by :func:`encode`, which accepts exact builtin types (``type(x) is int``, never a
subclass) and nothing else: an object whose ``__eq__`` always answers True, a str subclass or a
callable cannot be encoded, and :func:`decode` on the other side builds fresh builtin values
that no code of the completion has touched.

Format: None, bool, float, str and lists are JSON natives; an int is a JSON int (a hex string
under the tag ``"i"`` past 4,000 digits, which Python's int/str limit would refuse); tuples,
sets, frozensets, dicts (as key/value pairs), bytes (hex) and complex numbers are objects
``{"t": tag, "v": ...}``.
"""

import json

WIRE_DEPTH = 100          # nesting deeper than this is refused (both directions)
_BIG = 10 ** 4000


def encode(value, depth=0):
    """``value`` as JSON-ready plain data; TypeError for anything but exact builtin data."""
    kind = type(value)
    if depth > WIRE_DEPTH:
        raise TypeError("value nested too deeply")
    if value is None or kind is bool or kind is str or kind is float:
        return value
    if kind is int:
        return value if -_BIG < value < _BIG else {"t": "i", "v": hex(value)}
    if kind is list:
        return [encode(item, depth + 1) for item in value]
    if kind is tuple or kind is set or kind is frozenset:
        return {"t": kind.__name__, "v": [encode(item, depth + 1) for item in value]}
    if kind is dict:
        return {"t": "dict", "v": [[encode(k, depth + 1), encode(v, depth + 1)]
                                   for k, v in value.items()]}
    if kind is bytes:
        return {"t": "bytes", "v": value.hex()}
    if kind is complex:
        return {"t": "complex", "v": [value.real, value.imag]}
    raise TypeError(f"{kind.__name__} is not plain data")


def decode(data, depth=0):
    """The builtin value of :func:`encode`'s output; ValueError on anything else."""
    kind = type(data)
    if depth > WIRE_DEPTH:
        raise ValueError("value nested too deeply")
    if data is None or kind in (bool, int, float, str):
        return data
    if kind is list:
        return [decode(item, depth + 1) for item in data]
    if kind is not dict or set(data) != {"t", "v"}:
        raise ValueError(f"not plain data on the wire: {kind.__name__}")
    tag, body = data["t"], data["v"]
    if tag == "i" and type(body) is str:
        return int(body, 16)
    if tag == "bytes" and type(body) is str:
        return bytes.fromhex(body)
    if type(body) is not list:
        raise ValueError(f"bad body for tag {tag!r}")
    if tag == "complex" and len(body) == 2 and all(type(x) in (int, float) for x in body):
        return complex(body[0], body[1])
    items = [decode(item, depth + 1) for item in body]
    if tag == "tuple":
        return tuple(items)
    if tag == "set":
        return set(items)
    if tag == "frozenset":
        return frozenset(items)
    if tag == "dict" and all(type(p) is list and len(p) == 2 for p in items):
        return {k: v for k, v in items}
    raise ValueError(f"unknown wire tag {tag!r}")


def dumps(value):
    """One line of JSON (no newline inside: JSON escapes them)."""
    return json.dumps(encode(value), separators=(",", ":"))


def loads(line):
    """:func:`decode` of one line; ValueError (or RecursionError) on malformed input."""
    return decode(json.loads(line))
