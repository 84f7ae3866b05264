"""How the records of one ``Client.send`` become the batches of its pushes.

A keyed send groups its records by partition and packs each partition's
records into msgpack while they are still in the processor's cache,
:data:`PACK_CHUNK` records at a time (:func:`packed_steps`). The steps are
handed to the pushes as they are made, so the first partitions' pushes are
under way while later records are still being grouped: for 1,000,000 taxi
records, grouping and packing take about 0.35 s of the client's CPU, which
the workers would otherwise spend idle.

Handing batches over before the whole send is packed is safe only when no
record can fail to pack, because a keyed send promises that a record msgpack
cannot carry fails the send before anything is pushed.
:func:`packs_surely` says when that holds (ASCII text keys and values, the
common case, checked in C); otherwise the client packs the whole send first.
An unkeyed send is cut into batches of whole slices, packed as each is pushed.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator, Sequence
from typing import Any

from gridstream import codec
from gridstream.ids import partition_for_key
from gridstream.v1 import common_pb2

SPREAD_MIN_BATCH = 5_000
"""An unkeyed send of a list is cut into one batch per partition, but into
batches of no fewer records than this (or ``batch_size`` if smaller): a batch
costs the cluster about as much as thousands of records, so a small send goes
whole to one partition rather than in slivers to all."""

PACK_CHUNK = 16_384
"""Records of a keyed send grouped by partition, and packed, at a time.
Packing a partition's records right after grouping them reads them while
they are in the processor's cache; packing each partition of a whole send
afterwards reads every Nth record of the send (1,000,000 taxi records in 12
partitions: 0.32 s against 0.04 s for the same records in send order)."""


class Batch:
    """Records for one push to one partition.

    A keyed send's batch is packed while its records are grouped
    (:func:`packed_steps`) and is pushed in that wire form; its keys and
    values as lists are needed only when a push refuses it as too large and
    it is cut in two (:func:`halves`). They are kept as the runs the grouping
    made and joined into lists on first use: joining every batch's runs
    took packing 1,000,000 taxi records from 0.29 to 0.37 s (best of five)."""

    __slots__ = ("_keys", "_runs", "_values", "count", "encoded")

    def __init__(self, keys: list[Any] | None, values: list[Any],
                 encoded: common_pb2.RecordBatch | None = None) -> None:
        self.count = len(values)
        self.encoded = encoded
        """Its wire form, when packed while its records were grouped
        (:func:`packed_steps`); None: packed when pushed."""
        self._keys = keys
        self._values: list[Any] | None = values
        self._runs: list[tuple[list[Any], list[Any]]] | None = None
        """Consecutive keyed runs ``(keys, values)`` not joined yet (then
        ``_keys`` and ``_values`` are None)."""

    @classmethod
    def of_runs(cls, runs: list[tuple[list[Any], list[Any]]], count: int,
                encoded: common_pb2.RecordBatch) -> Batch:
        """A packed batch of consecutive keyed runs ``(keys, values)``,
        ``count`` records in all; the runs are joined only if asked for."""
        batch = cls.__new__(cls)
        batch.count, batch.encoded = count, encoded
        batch._keys, batch._values, batch._runs = None, None, runs
        return batch

    def _join(self) -> None:
        if self._runs is not None:
            runs, self._runs = self._runs, None
            self._keys = list(itertools.chain.from_iterable(r[0] for r in runs))
            self._values = list(itertools.chain.from_iterable(r[1] for r in runs))

    @property
    def keys(self) -> list[Any] | None:
        """The records' keys (None: an unkeyed batch)."""
        self._join()
        return self._keys

    @property
    def values(self) -> list[Any]:
        """The records."""
        self._join()
        assert self._values is not None
        return self._values


Step = list[tuple[int, Batch]]
"""The batches (partition, batch) one step of packing completed, each
partition's in the order they are to be pushed."""


def packs_surely(keys: Sequence[Any], values: Sequence[Any]) -> bool:
    """Whether msgpack is certain to pack every key and value, so a keyed
    send may push its first batches before the last are packed: every key
    and value is ASCII text (``str.isascii`` reads a flag of the string, so
    this costs one C call per record). Anything else (other types, or text
    with characters UTF-8 may refuse, such as lone surrogates) is packed in
    full before the first push."""
    try:
        return all(map(str.isascii, keys)) and all(map(str.isascii, values))
    except TypeError:  # a key or value that is not a str
        return False


def packed_steps(keys: Sequence[Any], values: list[Any], partitions: int,
                 batch_size: int) -> Iterator[Step]:
    """A keyed send's batches, each at most ``batch_size`` records of one
    partition in record order, packed :data:`PACK_CHUNK` records at a time
    (:func:`gridstream.codec.batch_of_runs` joins the runs). Yields, per
    chunk, the batches the chunk filled, then the partly filled ones in
    partition order. Raises :class:`gridstream.codec.PayloadError` at the
    chunk holding a record msgpack cannot carry."""
    runs: dict[int, list[tuple[list[Any], list[Any], bytes, bytes]]] = {}
    counts: dict[int, int] = {}
    known: dict[str, int] = {}

    def close(p: int) -> Batch:
        parts = runs.pop(p)
        count = counts.pop(p)
        return Batch.of_runs([(r[0], r[1]) for r in parts], count,
                             codec.batch_of_runs(count, [r[2] for r in parts],
                                                 [r[3] for r in parts]))

    step = min(PACK_CHUNK, batch_size)  # a run always fits in an empty batch
    for start in range(0, len(values), step):
        closed: Step = []
        grouped = group_by_partition(keys[start:start + step], values[start:start + step],
                                     partitions, known)
        for p, (bk, bv) in grouped.items():
            if counts.get(p, 0) + len(bv) > batch_size:
                closed.append((p, close(p)))
            runs.setdefault(p, []).append((bk, bv, codec.packed_items(bk),
                                           codec.packed_items(bv)))
            counts[p] = counts.get(p, 0) + len(bv)
        yield closed
    yield [(p, close(p)) for p in sorted(runs)]


def group_by_partition(keys: Sequence[Any], values: list[Any], partitions: int,
                       known: dict[str, int] | None = None
                       ) -> dict[int, tuple[list[Any], list[Any]]]:
    """Keys and values per partition (:func:`partition_for_key`), in record
    order, partitions in ascending order. A str key's partition is computed
    once per distinct key (only exact str keys are remembered in ``known``:
    ``1``, ``1.0`` and ``True`` are equal as dict keys but not as partition
    keys). The remembered partitions are looked up in one C call over the
    keys and the records dealt with bound ``append``s: per 200,000 taxi
    records 31 against 40 ms for a loop that looked each key up itself."""
    known = {} if known is None else known
    try:
        places: list[int | None] = list(map(known.get, keys))
    except TypeError:  # an unhashable key (a list): each is placed on its own
        places = [None] * len(keys)
    if None in places:
        for i, place in enumerate(places):
            if place is None:
                places[i] = _place(keys[i], partitions, known)
    bucket_keys: list[list[Any]] = [[] for _ in range(partitions)]
    bucket_values: list[list[Any]] = [[] for _ in range(partitions)]
    add_key = [bucket.append for bucket in bucket_keys]
    add_value = [bucket.append for bucket in bucket_values]
    for p, k, v in zip(places, keys, values, strict=True):
        add_key[p](k)  # type: ignore[index]  # every place was filled above
        add_value[p](v)  # type: ignore[index]
    return {p: (bucket_keys[p], bucket_values[p]) for p in range(partitions)
            if bucket_values[p]}


def _place(key: Any, partitions: int, known: dict[str, int]) -> int:
    """``key``'s partition, remembered in ``known`` when it is an exact str.
    Only a str (or a str subclass, whose text and so whose partition is the
    same) can equal a remembered key, so the lookup over all keys in
    :func:`group_by_partition` never gives a key another type's partition."""
    if type(key) is str:
        place = known.get(key)
        if place is None:
            place = known[key] = partition_for_key(key, partitions)
        return place
    return partition_for_key(key, partitions)


def unkeyed_batch_size(batch_size: int, count: int, partitions: int) -> int:
    """Records per batch of an unkeyed send of ``count`` records: one batch per
    partition when that stays within ``batch_size``, but no fewer records
    than :data:`SPREAD_MIN_BATCH` (or ``batch_size`` if smaller) a batch."""
    floor = min(batch_size, SPREAD_MIN_BATCH)
    return min(batch_size, max(floor, -(-count // max(1, partitions))))


def halves(batch: Batch) -> list[Batch]:
    """A batch cut in two, keys with their values (each packed when pushed)."""
    keys, values = batch.keys, batch.values
    middle = len(values) // 2
    return [Batch(None if keys is None else keys[:middle], values[:middle]),
            Batch(None if keys is None else keys[middle:], values[middle:])]


class SendOrder:
    """Has one client's sends to one job hand their batches to the partitions'
    pushes in the order the sends were called. A partition's pushes take the batches
    of one send after another, first come first served
    (``Client._send_partition``), and a long keyed send hands a partition its
    first batch only once packing has filled it: a send called after it and
    packed in one step would otherwise reach that partition first, and a
    key's later records would be applied before its earlier ones. So a send
    packs only once every send called before it has handed over all its
    batches (whose pushes may still be running)."""

    def __init__(self) -> None:
        self._last: asyncio.Future[None] | None = None

    def take_turn(self) -> SendTurn:
        """The calling send's turn, behind every send that took one before:
        taken before the send's first ``await``, so in call order."""
        turn = SendTurn(self._last, asyncio.get_running_loop().create_future())
        self._last = turn.handed_over
        return turn


class SendTurn:
    """One send's place in its client's :class:`SendOrder`."""

    def __init__(self, earlier: asyncio.Future[None] | None,
                 handed_over: asyncio.Future[None]) -> None:
        self._earlier = earlier
        self.handed_over = handed_over
        """Done once this send and every send before it handed over their batches."""
        self._finished = False

    async def wait(self) -> None:
        """Returns once every earlier send has handed over its batches. A
        send cancelled meanwhile leaves the earlier ones untouched."""
        if self._earlier is not None:
            await asyncio.shield(self._earlier)

    def finish(self) -> None:
        """This send has handed over every batch it will (all of them, or
        none when it failed): the next send may pack once the earlier ones
        have finished too. Called again, it does nothing."""
        if self._finished:
            return
        self._finished = True
        if self._earlier is None or self._earlier.done():
            self._release()
        else:
            self._earlier.add_done_callback(lambda _: self._release())

    def _release(self) -> None:
        if not self.handed_over.done():
            self.handed_over.set_result(None)


class BatchFeed:
    """One partition's batches of one send, in push order, handed over while
    the send is still packing later ones; closed once the send has no more
    for the partition. The partition's pushes take them one at a time."""

    def __init__(self, closed: bool = False) -> None:
        """``closed``: a feed with no batch at all (a flush pushes only what
        earlier sends left)."""
        self._queue: asyncio.Queue[Batch | None] = asyncio.Queue()
        if closed:
            self.close()

    def put(self, batch: Batch) -> None:
        """Hands over the partition's next batch."""
        self._queue.put_nowait(batch)

    def close(self) -> None:
        """No batch follows those handed over."""
        self._queue.put_nowait(None)

    async def next(self) -> Batch | None:
        """The next batch, once packed; None once the feed is closed and empty."""
        batch = await self._queue.get()
        if batch is None:
            self._queue.put_nowait(None)  # closed stays closed for the next caller
        return batch

    async def rest(self) -> list[Batch]:
        """Every batch still to come (waits for the feed to close)."""
        batches: list[Batch] = []
        while (batch := await self.next()) is not None:
            batches.append(batch)
        return batches
