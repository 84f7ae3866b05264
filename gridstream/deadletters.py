"""The stored form of a dead letter's record and error.

A dead letter is stored as four strings (id, stage, record, error; see
``WriteResultsRequest.dead_letters`` in ``stateserver.proto``). The worker
fills ``record`` and ``error`` with small JSON documents, so a reader gets
the record itself as JSON rather than a Python repr, and the error with its
traceback:

* record: ``{"value": V}`` or ``{"key": K, "value": V}`` when the record is
  representable as JSON, else ``{"repr": "..."}`` (Python's repr, cut);
* error: ``{"error": "ValueError: ...", "traceback": "Traceback ..."}``.

Both are bounded (a poison record can be huge, a recursion's traceback
long), and encoding never raises: describing a bad record must not be what
stops a partition. Dead letters stored before this format (a bare repr and
``Type: message``) still read, as a repr without a traceback.
"""

from __future__ import annotations

import json
import traceback
from typing import Any

TEXT_LIMIT = 1000
"""Characters of a record's repr or an error message kept in a dead letter."""
JSON_LIMIT = 4000
"""Characters of a record's JSON kept; a larger record is stored as its cut repr."""
TRACEBACK_LIMIT = 4000
"""Characters of a traceback kept (its end: the innermost frames and the error)."""
TRACEBACK_FRAMES = 12
"""Innermost frames of a traceback kept."""


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _repr(key: Any, value: Any) -> str:
    try:
        return _cut(repr(value) if key is None else f"{key!r}: {value!r}", TEXT_LIMIT)
    except Exception as exc:  # RecursionError, a user __repr__ that raises
        return f"<unprintable {type(value).__name__}: {type(exc).__name__}>"


def encode_record(key: Any, value: Any) -> str:
    """The stored ``record`` of a dead letter; never raises."""
    try:
        document = {"value": value} if key is None else {"key": key, "value": value}
        text = json.dumps(document, allow_nan=False)
        if len(text) <= JSON_LIMIT:
            return text
    except Exception:  # not JSON: a set, bytes, an object, NaN, too deep
        pass
    try:
        return json.dumps({"repr": _repr(key, value)})
    except Exception:  # a repr with lone surrogates
        return json.dumps({"repr": f"<unprintable {type(value).__name__}>"})


def error_line(exc: BaseException) -> str:
    """``Type: message``, cut; never raises."""
    try:
        return _cut(f"{type(exc).__name__}: {exc}", TEXT_LIMIT)
    except Exception:  # an exception whose __str__ fails
        return type(exc).__name__


def traceback_text(exc: BaseException) -> str:
    """The exception's traceback, its innermost frames only and cut from the
    front to :data:`TRACEBACK_LIMIT`; empty if it cannot be formatted."""
    try:
        text = "".join(traceback.format_exception(exc, limit=-TRACEBACK_FRAMES))
    except Exception:  # a broken __str__, source lines that cannot be read
        return ""
    if len(text) > TRACEBACK_LIMIT:
        text = "…" + text[-(TRACEBACK_LIMIT - 1):]
    return text


def encode_error(exc: BaseException, with_traceback: bool = True) -> str:
    """The stored ``error`` of a dead letter; never raises."""
    trace = traceback_text(exc) if with_traceback else ""
    try:
        return json.dumps({"error": error_line(exc), "traceback": trace})
    except Exception:  # text that JSON cannot carry (lone surrogates)
        return json.dumps({"error": type(exc).__name__, "traceback": ""})


def encode_message(message: str) -> str:
    """The stored ``error`` of a failure that is not an exception of ours to
    trace (a record refused by the encoder, say)."""
    return json.dumps({"error": _cut(message, TEXT_LIMIT), "traceback": ""})


def _document(text: str) -> dict[str, Any] | None:
    try:
        loaded = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return loaded if isinstance(loaded, dict) else None


def decode_record(text: str) -> tuple[Any, Any, str]:
    """(key, record, format) of a stored record: format ``json`` when the
    record is its JSON value, ``repr`` when it is a Python repr (a string)."""
    document = _document(text)
    if document is not None and "value" in document:
        return document.get("key"), document["value"], "json"
    if document is not None and isinstance(document.get("repr"), str):
        return None, document["repr"], "repr"
    return None, text, "repr"  # stored before records were JSON


def decode_error(text: str) -> tuple[str, str]:
    """(error, traceback) of a stored error."""
    document = _document(text)
    if document is not None and isinstance(document.get("error"), str):
        trace = document.get("traceback")
        return document["error"], trace if isinstance(trace, str) else ""
    return text, ""  # stored before errors had tracebacks
