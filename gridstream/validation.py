"""Limits every service applies to what callers send, in one place.

A request comes from the network, so nothing in it is trusted: ids are
checked against a character set and a length before they reach a dict key, a
log line, a file or an error message; numbers must be finite and in range;
nested values must stay below a documented depth so that no recursive code
(repr, json, msgpack, the user's own) can overflow the stack on them. Every
refusal is an :class:`InvalidArgument` whose message echoes at most a short
prefix of what was sent, so an error can never be larger than gRPC's
metadata limit.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from google.protobuf.descriptor import FieldDescriptor

from gridstream.errors import InvalidArgument

MAX_ID_CHARS = 128
"""Longest job id, node id, incarnation or producer name accepted."""

MAX_PATH_ID_CHARS = 256
"""Longest slash-separated id (operator ids, channels)."""

MAX_NESTING = 100
"""Deepest nesting of lists and maps accepted in a record (and in a stage's
``initial`` value): a value inside 100 nested lists is refused with
INVALID_ARGUMENT at ingest, before it reaches an operator."""

ECHO_CHARS = 40
"""How much of a refused value an error message repeats."""

MAX_CLIENT_SEQUENCE = 2**62 - 1
"""Highest sequence a client may give a batch; the range above is reserved
for the cluster's own channels and replays."""

SOURCE_CHANNEL_PREFIX = "src/"
"""Channels of clients (the SDK, the Spark bridge): ``src/<producer>``."""

_ID = re.compile(r"^[A-Za-z0-9_.:@+=-]+$")
_ADDRESS = re.compile(r"^[A-Za-z0-9_.:\[\]%-]{1,255}$")


def short(value: str | bytes, limit: int = ECHO_CHARS) -> str:
    """``repr`` of a value cut to ``limit`` characters, saying how long it was."""
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}... ({len(value)} characters)"


def check_id(value: str, name: str, *, required: bool = True,
             limit: int = MAX_ID_CHARS) -> str:
    """An identifier: 1..limit characters of letters, digits and ``_.:@+=-``,
    not ``.`` or ``..`` (never a path)."""
    if not value:
        if required:
            raise InvalidArgument(f"{name} is empty; set it (nothing was done)")
        return value
    if len(value) > limit or not _ID.match(value) or value in (".", ".."):
        raise InvalidArgument(
            f"{name} {short(value)} is not a valid id: use 1-{limit} letters, digits or "
            "'_.:@+=-' (nothing was done)")
    return value


def check_path_id(value: str, name: str, *, required: bool = True,
                  limit: int = MAX_PATH_ID_CHARS) -> str:
    """A slash-separated id (``job/t0/p3``, ``src/producer``): each part an id,
    no empty, ``.`` or ``..`` part."""
    if not value:
        if required:
            raise InvalidArgument(f"{name} is empty; set it (nothing was done)")
        return value
    if len(value) > limit or not all(
            part and part not in (".", "..") and _ID.match(part) for part in value.split("/")):
        raise InvalidArgument(
            f"{name} {short(value)} is not a valid id: use 1-{limit} characters of "
            "slash-separated parts of letters, digits or '_.:@+=-' (nothing was done)")
    return value


def check_address(value: str, name: str = "address") -> str:
    """A ``host:port`` members dial."""
    host, _, port = value.rpartition(":")
    if not _ADDRESS.match(value) or not host or not port.isdigit() or int(port) > 65535:
        raise InvalidArgument(f"{name} {short(value)} is not host:port (nothing was done)")
    return value


def check_number(value: float, name: str, low: float, high: float) -> float:
    """A finite number within [low, high]."""
    if not math.isfinite(value) or not low <= value <= high:
        raise InvalidArgument(f"{name} is {value!r}; it must be a finite number between "
                              f"{low:g} and {high:g}")
    return value


def nesting_depth(value: Any, limit: int = MAX_NESTING) -> int:
    """Depth of nested lists, tuples and dicts in ``value`` (a scalar is 0),
    counted without recursion and given up at ``limit + 1``."""
    if not isinstance(value, list | tuple | dict):
        return 0
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > deepest:
            deepest = depth
            if deepest > limit:
                return deepest
        children: Iterable[Any] = (
            [*item.keys(), *item.values()] if isinstance(item, dict) else item)
        for child in children:
            if isinstance(child, list | tuple | dict):
                stack.append((child, depth + 1))
    return deepest


_SCALARS = frozenset({str, int, float, bool, bytes, type(None)})
"""Types that nest nothing (their subclasses are looked at one by one)."""


_SEQUENCES = frozenset({list, tuple})


def check_nesting(values: Iterable[Any], what: str, limit: int = MAX_NESTING) -> None:
    """Refuses the first value nested deeper than ``limit``, naming its index.
    The usual batches are recognised in a few passes in C over the types,
    not value by value in Python (the client checks every batch it sends):
    a list of scalars (text lines, keys), and records one level deep, every
    one a list or tuple of scalars (``[line, stamp]``) or every one a dict
    of scalar keys and values (a parsed JSON object). At 60,000 ``[text,
    float]`` records, the walk took 67 ms."""
    if isinstance(values, list | tuple):
        types = set(map(type, values))
        if _SCALARS.issuperset(types) or (limit >= 1 and _one_level_deep(values, types)):
            return
    for index, value in enumerate(values):
        if isinstance(value, list | tuple | dict) and nesting_depth(value, limit) > limit:
            raise InvalidArgument(
                f"{what} {index} is nested more than {limit} levels deep (the limit for "
                "records and initial values); flatten it (nothing was accepted)")


def _one_level_deep(values: list[Any] | tuple[Any, ...], types: set[type]) -> bool:
    """Whether ``values`` (of these ``types``) are all lists or tuples of
    scalars, or all dicts whose keys and values are scalars."""
    if _SEQUENCES.issuperset(types):
        return _SCALARS.issuperset(map(type, itertools.chain.from_iterable(values)))
    if types == {dict}:
        return (_SCALARS.issuperset(map(type, itertools.chain.from_iterable(values)))
                and _SCALARS.issuperset(map(type, itertools.chain.from_iterable(
                    map(dict.values, values)))))
    return False


def json_nesting_depth(text: str, limit: int = MAX_NESTING) -> int:
    """Depth of ``[``/``{`` nesting of a JSON text, without parsing it (so a
    text nested 100,000 deep cannot exhaust the parser's stack)."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    return deepest
        elif char in "]}":
            depth -= 1
    return deepest


# -- every request, field by field -------------------------------------------------

MAX_WIRE_INTEGER = 2**63 - 1
"""Largest integer any request field may carry: epochs, sequences, offsets,
windows and versions are stored as SQLite's signed 64-bit integers and
compared with Python's unbounded ones, so a larger value is never legitimate."""

ID_FIELDS = frozenset({"job_id", "job_ids", "node_id", "incarnation", "primary", "sender"})
"""Request fields holding plain ids (:func:`check_id`)."""

PATH_ID_FIELDS = frozenset({"operator_id", "channel", "reporter"})
"""Request fields holding slash-separated ids (:func:`check_path_id`)."""

CHANNEL_KEYED_MAPS = frozenset({"sequences"})
"""Map fields whose keys are channels."""

HASH_FIELDS = frozenset({"root"})
"""Integer fields holding 64-bit hashes (tuple ids), which use the full
unsigned range; every other integer is at most :data:`MAX_WIRE_INTEGER`."""

MAX_CHECKSUM_CHARS = 64
"""Longest checksum a request may carry (gridstream's are 16 hex digits)."""

_HEX = re.compile(r"^[0-9a-f]+$")


def check_request(message: Any, where: str = "") -> None:
    """Checks every field a request message sets, at any depth, before a
    servicer sees it: ids (by field name) are ids, integers at most
    :data:`MAX_WIRE_INTEGER`, floating-point numbers finite, checksums short
    hex. The RPC layer calls it for every request of every gridstream
    service, members' included, so no servicer can forget a field; servicers
    still check what only they know (a task or partition a job has).
    Raises :class:`InvalidArgument` naming the field.

    Every call of the cluster passes through here, so the common case (a
    valid request) walks a plan compiled once per message type
    (:func:`_plan_of`) that visits only the fields that can be wrong and
    builds no field names; a request it finds wrong is walked again field by
    field (:func:`_check_named`), which names what to fix."""
    if not _passes(message, _plan_of(message.DESCRIPTOR)):
        _check_named(message, where)


def _check_named(message: Any, where: str) -> None:
    for field, value in message.ListFields():
        name = f"{where}{field.name}"
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            _check_map(field, value, name)
        elif _is_repeated(field):
            for index, item in enumerate(value):
                _check_value(field, item, f"{name}[{index}]")
        else:
            _check_value(field, value, name)


def _is_repeated(field: Any) -> bool:
    repeated = getattr(field, "is_repeated", None)
    if repeated is not None:
        return bool(repeated)
    return bool(field.label == field.LABEL_REPEATED)


def _check_map(field: Any, value: Any, name: str) -> None:
    value_field = field.message_type.fields_by_name["value"]
    for key, item in value.items():
        if field.name in CHANNEL_KEYED_MAPS:
            check_path_id(key, f"{name} key")
        _check_value(value_field, item, f"{name}[{short(str(key))}]")


def _check_value(field: Any, value: Any, name: str) -> None:
    if field.message_type is not None:
        _check_named(value, f"{name}.")
    elif isinstance(value, bool):
        return
    elif isinstance(value, int):
        if field.name not in HASH_FIELDS and not -MAX_WIRE_INTEGER - 1 <= value <= MAX_WIRE_INTEGER:
            raise InvalidArgument(f"{name} is {value}, above 2**63-1; no gridstream number "
                                  "is that large (nothing was done)")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidArgument(f"{name} is {value!r}; numbers must be finite "
                                  "(nothing was done)")
    elif isinstance(value, str):
        _check_text(field.name, value, name)


def _check_text(field_name: str, value: str, name: str) -> None:
    if field_name in ID_FIELDS:
        check_id(value, name, required=False)
    elif field_name in PATH_ID_FIELDS:
        check_path_id(value, name, required=False)
    elif field_name == "address":
        check_address(value, name)
    elif field_name == "checksum" and (len(value) > MAX_CHECKSUM_CHARS
                                       or not _HEX.match(value)):
        raise InvalidArgument(f"{name} {short(value)} is not a checksum (at most "
                              f"{MAX_CHECKSUM_CHARS} lowercase hex digits; nothing was done)")


# -- the compiled plan of a message type (the fast path of check_request) ---------

_MESSAGE, _MAP, _INTEGER, _FLOAT, _TEXT = range(5)
_UNBOUNDED_INTEGERS = frozenset({FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64})
"""Integer types that can exceed :data:`MAX_WIRE_INTEGER` (signed and 32-bit
ones cannot: protobuf bounds them)."""
_FLOATS = frozenset({FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT})


@dataclass(frozen=True)
class _FieldCheck:
    """One field of a message type that a request could get wrong."""

    name: str
    kind: int
    repeated: bool
    plan: list[_FieldCheck] | None = None
    """The sub-message's plan (a map's value message's, for maps)."""
    value_kind: int = _MESSAGE
    """A map's value: a message (``plan``) or a scalar of this kind."""
    text: Callable[[str], object] | None = None
    """The check of a text field or a map key; raises InvalidArgument."""


_PLANS: dict[str, list[_FieldCheck]] = {}
_BUILDING: set[str] = set()
"""Message types whose plan is being compiled (a type may contain itself)."""


def _plan_of(descriptor: Any) -> list[_FieldCheck]:
    """The fields of a message type worth visiting, compiled on first use: a
    field that can never be refused (bytes, bools, enums, signed or 32-bit
    integers, free text) and a sub-message with no such field are left out."""
    plan = _PLANS.get(descriptor.full_name)
    if plan is not None:
        return plan
    plan = _PLANS[descriptor.full_name] = []  # placed first: types may nest themselves
    _BUILDING.add(descriptor.full_name)
    try:
        for field in descriptor.fields:
            check = _field_check(field)
            if check is not None:
                plan.append(check)
    finally:
        _BUILDING.discard(descriptor.full_name)
    return plan


def _scalar_kind(field: Any) -> tuple[int, Callable[[str], object] | None] | None:
    """What a scalar field needs checked, if anything."""
    if field.type in _UNBOUNDED_INTEGERS:
        return None if field.name in HASH_FIELDS else (_INTEGER, None)
    if field.type in _FLOATS:
        return _FLOAT, None
    if field.type != FieldDescriptor.TYPE_STRING:
        return None
    text = _text_check(field.name)
    return None if text is None else (_TEXT, text)


_KNOWN_GOOD_MAX = 4096
"""Ids remembered as valid per kind (a cluster names the same few jobs,
members and channels in every call); the set is emptied when full, so no
caller can make it grow."""


class _KnownGood:
    """The ids that passed one check lately: a repeat costs a set lookup, not
    a regular expression."""

    def __init__(self, check: Callable[[str], object]) -> None:
        self._check = check
        self._good: set[str] = set()

    def __call__(self, value: str) -> None:
        if value in self._good:
            return
        self._check(value)  # raises; the named walk then says which field
        if len(self._good) >= _KNOWN_GOOD_MAX:
            self._good.clear()
        self._good.add(value)


_IDS = _KnownGood(lambda value: check_id(value, "id", required=False))
_PATH_IDS = _KnownGood(lambda value: check_path_id(value, "id", required=False))
_CHANNEL_KEYS = _KnownGood(lambda value: check_path_id(value, "key"))
"""Map keys that are channels: never empty (as :func:`_check_map` says)."""


def _text_check(field_name: str) -> Callable[[str], object] | None:
    if field_name in ID_FIELDS:
        return _IDS
    if field_name in PATH_ID_FIELDS:
        return _PATH_IDS
    if field_name in ("address", "checksum"):
        return lambda value: _check_text(field_name, value, field_name)
    return None


def _field_check(field: Any) -> _FieldCheck | None:
    repeated = _is_repeated(field)
    if field.message_type is None:
        scalar = _scalar_kind(field)
        if scalar is None:
            return None
        return _FieldCheck(field.name, scalar[0], repeated, text=scalar[1])
    if field.message_type.GetOptions().map_entry:
        key_check = _CHANNEL_KEYS if field.name in CHANNEL_KEYED_MAPS else None
        value_field = field.message_type.fields_by_name["value"]
        if value_field.message_type is not None:
            plan = _plan_of(value_field.message_type)
            if not plan and key_check is None:
                return None
            return _FieldCheck(field.name, _MAP, True, plan, _MESSAGE, key_check)
        scalar = _scalar_kind(value_field)
        if scalar is None and key_check is None:
            return None
        return _FieldCheck(field.name, _MAP, True, None,
                           scalar[0] if scalar else -1, key_check)
    plan = _plan_of(field.message_type)
    if not plan and field.message_type.full_name not in _BUILDING:
        return None  # nothing in it can be wrong
    return _FieldCheck(field.name, _MESSAGE, repeated, plan)


def _passes(message: Any, plan: list[_FieldCheck]) -> bool:
    """Whether every field of ``plan`` holds (no names, no allocation on the
    way; a False answer is explained by :func:`_check_named`)."""
    try:
        return _fields_pass(message, plan)
    except InvalidArgument:
        return False


def _fields_pass(message: Any, plan: list[_FieldCheck]) -> bool:
    for check in plan:
        value = getattr(message, check.name)
        kind = check.kind
        if kind == _MESSAGE:
            assert check.plan is not None
            if check.repeated:
                for item in value:
                    if not _fields_pass(item, check.plan):
                        return False
            elif message.HasField(check.name) and not _fields_pass(value, check.plan):
                return False
        elif kind == _TEXT and not check.repeated:
            if value:
                assert check.text is not None
                check.text(value)
        elif kind == _INTEGER and not check.repeated:
            if value > MAX_WIRE_INTEGER:
                return False
        elif kind == _MAP:
            if value and not _map_passes(value, check):
                return False
        elif not _scalars_pass(value if check.repeated else (value,), kind, check.text):
            return False
    return True


def _map_passes(value: Any, check: _FieldCheck) -> bool:
    if check.text is not None:
        for key in value:
            check.text(key)
    if check.plan is not None:
        return all(_fields_pass(item, check.plan) for item in value.values())
    return _scalars_pass(list(value.values()), check.value_kind, None)


def _scalars_pass(values: Any, kind: int, text: Callable[[str], object] | None) -> bool:
    if not values:
        return True
    if kind == _INTEGER:
        return bool(max(values) <= MAX_WIRE_INTEGER)
    if kind == _FLOAT:
        return all(map(math.isfinite, values))
    if kind == _TEXT and text is not None:
        for item in values:
            if item:
                text(item)
    return True
