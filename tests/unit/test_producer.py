"""The Producer's batching: each send carries what was put while the one
before was in flight, in put order, within its limits, and a failed send
stops the producer loudly. The sends here go to a recording stand-in for
``Client.send`` (the logic under test is the producer's own); the
producer against a real cluster is tests/integration/test_producer.py."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from gridstream.errors import Unavailable
from gridstream.producer import Producer, ProducerStopped


class HeldSends:
    """Records each send and holds it until released (or failed)."""

    def __init__(self) -> None:
        self.sends: list[tuple[list[Any] | None, list[Any]]] = []
        self.gates: list[asyncio.Future[None]] = []
        self.started = asyncio.Event()
        self.on_send: Callable[[], None] = lambda: None
        """Called as each send starts (after it is recorded)."""

    async def send(self, job_id: str, values: Sequence[Any],
                   keys: Sequence[Any] | None = None) -> int:
        assert job_id == "job-1"
        self.sends.append((None if keys is None else list(keys), list(values)))
        gate = asyncio.get_running_loop().create_future()
        self.gates.append(gate)
        self.on_send()
        self.started.set()
        await gate
        return len(values)

    async def wait_sends(self, count: int) -> None:
        async with asyncio.timeout(5):
            while len(self.sends) < count:
                self.started.clear()
                await self.started.wait()

    def release(self, index: int, error: BaseException | None = None) -> None:
        if error is None:
            self.gates[index].set_result(None)
        else:
            self.gates[index].set_exception(error)


def producer_of(held: HeldSends, **limits: int) -> Producer:
    return Producer(held, "job-1", **limits)


async def flushed(producer: Producer) -> None:
    """Flushes, failing the test rather than waiting long."""
    async with asyncio.timeout(5):
        await producer.flush()


async def test_records_put_while_a_send_is_in_flight_go_together_in_the_next() -> None:
    held = HeldSends()
    async with producer_of(held) as producer:
        await producer.put(["a"])
        await held.wait_sends(1)
        for word in "bcdef":
            await producer.put([word])
        await asyncio.sleep(0)
        assert len(held.sends) == 1  # one in flight: the rest wait for it
        held.release(0)
        await held.wait_sends(2)
        assert held.sends[1] == (None, ["b", "c", "d", "e", "f"])
        held.release(1)
        await flushed(producer)
        assert producer.acknowledged == 6 and producer.sends == 2


async def test_sends_keep_put_order_and_never_mix_keyed_with_unkeyed_records() -> None:
    held = HeldSends()
    async with producer_of(held, max_send_records=3) as producer:
        await producer.put(["x"], ["k0"])
        await held.wait_sends(1)
        await producer.put(["a", "b"], ["k1", "k2"])
        await producer.put(["c", "d"], ["k3", "k4"])  # same run: joins it
        await producer.put(["plain"])
        await producer.put(["e"], ["k5"])
        for n in range(4):
            held.release(n)
            await held.wait_sends(n + 2)
        held.release(4)
        await flushed(producer)
    assert held.sends == [
        (["k0"], ["x"]),
        (["k1", "k2", "k3"], ["a", "b", "c"]),  # at most max_send_records
        (["k4"], ["d"]),
        (None, ["plain"]),
        (["k5"], ["e"]),
    ]


async def test_max_in_flight_sends_run_at_once() -> None:
    held = HeldSends()
    async with producer_of(held, max_in_flight=2) as producer:
        await producer.put(["a"])
        await held.wait_sends(1)
        await producer.put(["b"])
        await held.wait_sends(2)  # a second send while the first is held
        await producer.put(["c"])
        await asyncio.sleep(0)
        assert len(held.sends) == 2
        held.release(1)
        await held.wait_sends(3)
        held.release(0)
        held.release(2)
        await flushed(producer)
    assert [values for _, values in held.sends] == [["a"], ["b"], ["c"]]


async def test_records_taken_for_a_send_are_in_it_before_anything_else_is_taken() -> None:
    # Sends reach the partitions in the order they are called, so a sender
    # must call its send before another sender can take later records:
    # nothing may suspend between taking and calling.
    held = HeldSends()
    producer = producer_of(held, max_in_flight=2)
    put = 0

    def every_record_accounted_for() -> None:
        in_sends = sum(len(values) for (_, values), gate in zip(held.sends, held.gates,
                                                                strict=True)
                       if not gate.done())
        assert put == producer.acknowledged + producer.buffered + in_sends

    held.on_send = every_record_accounted_for
    async with producer:
        await producer.put(["a", "b"], ["k1", "k2"])
        await producer.put(["c"])  # a second run: both senders take at once
        put = 3
        await held.wait_sends(2)
        held.release(0)
        held.release(1)
        await flushed(producer)
    assert held.sends == [(["k1", "k2"], ["a", "b"]), (None, ["c"])]


async def test_put_waits_while_max_buffered_records_wait_to_be_sent() -> None:
    held = HeldSends()
    async with producer_of(held, max_buffered_records=2) as producer:
        await producer.put(["a"])
        await held.wait_sends(1)
        await producer.put(["b", "c"])  # buffered: 2, the limit
        blocked = asyncio.create_task(producer.put(["d"]))
        await asyncio.sleep(0.05)
        assert not blocked.done() and producer.buffered == 2
        held.release(0)
        await held.wait_sends(2)  # takes b and c: room again
        async with asyncio.timeout(5):
            await blocked
        held.release(1)
        await held.wait_sends(3)
        held.release(2)
        await flushed(producer)
    assert [values for _, values in held.sends] == [["a"], ["b", "c"], ["d"]]


async def test_a_failed_send_stops_the_producer_and_every_later_call_says_so() -> None:
    held = HeldSends()
    producer = producer_of(held)
    producer.start()
    await producer.put(["a", "b"])
    await held.wait_sends(1)
    await producer.put(["c"], ["k"])
    held.release(0, Unavailable("no worker answered"))
    with pytest.raises(Unavailable) as raised:
        async with asyncio.timeout(5):
            await flushed(producer)
    message = str(raised.value)
    assert "a send of 2 records failed (no worker answered)" in message
    assert "1 records put after it were not sent" in message
    assert producer.unsent == [(["k"], ["c"])]
    with pytest.raises(Unavailable):
        await producer.put(["d"])
    with pytest.raises(Unavailable):
        await producer.close()
    assert len(held.sends) == 1  # nothing was sent after the failure


async def test_a_closed_producer_refuses_records() -> None:
    held = HeldSends()
    async with producer_of(held) as producer:
        pass
    with pytest.raises(ProducerStopped, match="closed"):
        await producer.put(["a"])


async def test_limits_below_one_are_refused() -> None:
    held = HeldSends()
    for limit in ("max_in_flight", "max_send_records", "max_buffered_records"):
        with pytest.raises(ValueError, match=limit):
            producer_of(held, **{limit: 0})


async def test_a_failure_beside_a_send_that_succeeds_counts_each_once() -> None:
    held = HeldSends()
    producer = producer_of(held, max_in_flight=2)
    await producer.put(["a"])
    await held.wait_sends(1)
    await producer.put(["b", "c"])
    await held.wait_sends(2)
    await producer.put(["d"])
    held.release(0, Unavailable("worker gone"))
    held.release(1)
    with pytest.raises(Unavailable, match=r"a send of 1 records failed .*1 records put after"):
        await flushed(producer)
    assert producer.acknowledged == 2  # the send beside the failed one still counts
    assert producer.unsent == [(None, ["d"])]
    assert len(held.sends) == 2  # nothing was taken after the failure
    await producer.abort()


async def test_wait_stopped_returns_once_a_send_fails_and_not_before() -> None:
    held = HeldSends()
    producer = producer_of(held)
    await producer.put(["a"])
    await held.wait_sends(1)
    watcher = asyncio.create_task(producer.wait_stopped())
    await asyncio.sleep(0)
    assert not watcher.done()  # a send in flight is not a stop
    held.release(0, Unavailable("worker-1 went away"))
    async with asyncio.timeout(5):
        await watcher
    with pytest.raises(Unavailable, match="a send of 1 records failed"):
        await producer.close()


async def test_wait_stopped_returns_once_the_producer_is_closed() -> None:
    held = HeldSends()
    producer = producer_of(held)
    producer.start()
    watcher = asyncio.create_task(producer.wait_stopped())
    await producer.close()
    async with asyncio.timeout(5):
        await watcher
