"""A client's sends pack in the order they were called
(gridstream.sendbatches.SendOrder): each waits until every earlier send has
handed over its batches, including when one in the middle gives up."""

from __future__ import annotations

import asyncio

from gridstream.sendbatches import SendOrder


async def a_few_loop_steps() -> None:
    """Enough steps of the loop for a released turn's waiter to finish."""
    for _ in range(10):
        await asyncio.sleep(0)


async def test_each_send_waits_for_every_earlier_one_to_hand_over() -> None:
    order = SendOrder()
    first, second, third = order.take_turn(), order.take_turn(), order.take_turn()
    await asyncio.wait_for(first.wait(), 1)  # nothing before the first
    waiting = asyncio.ensure_future(third.wait())
    second.finish()  # the second is done before the first: the third still waits
    await a_few_loop_steps()
    assert not waiting.done()
    first.finish()
    await asyncio.wait_for(waiting, 1)
    await asyncio.wait_for(second.wait(), 1)


async def test_a_send_cancelled_in_its_wait_keeps_the_later_ones_behind_the_earlier() -> None:
    order = SendOrder()
    first, second, third = order.take_turn(), order.take_turn(), order.take_turn()
    cancelled = asyncio.ensure_future(second.wait())
    await asyncio.sleep(0)
    cancelled.cancel()
    second.finish()  # as Client.send's finally does
    later = asyncio.ensure_future(third.wait())
    await a_few_loop_steps()
    assert not later.done(), "the third went before the first had handed over"
    first.finish()
    first.finish()  # again: nothing more happens
    await asyncio.wait_for(later, 1)
    assert cancelled.cancelled() and first.handed_over.done()


async def test_a_turn_taken_after_every_send_finished_goes_at_once() -> None:
    order = SendOrder()
    done = order.take_turn()
    done.finish()
    await asyncio.wait_for(order.take_turn().wait(), 1)
