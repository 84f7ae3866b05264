"""The state server's SQLite writer runs below the rest of the machine.

On a machine shared with workers (a local cluster, a small deployment), the
state servers' bulk writes (window deltas, folds into a base of millions of
keys) can keep every core busy for minutes. Whatever runs beside them then
waits for a core: a worker's event loop (acknowledgements, replication,
closing windows) falls hundreds of milliseconds behind, and so does this
server's own loop, which answers claims and reads. Storage work is the part
that can wait: it is queued and group-committed, and a slower commit only
makes the next group larger.

So the writer connection's thread lowers its own scheduling priority (Linux
schedules threads one by one, so the rest of the process is untouched). When
cores are idle it changes nothing; when they are contended, event loops get
them first. A process cannot raise a priority back without privileges, which
is why only the thread that does bulk writing is lowered, once, for good.
"""

from __future__ import annotations

import logging
import os
import threading

import aiosqlite

log = logging.getLogger(__name__)


def _lower_calling_thread(by: int) -> int:
    """Adds ``by`` to the calling thread's niceness; returns the new value,
    or -1 where threads cannot be prioritised one by one."""
    setpriority = getattr(os, "setpriority", None)
    if setpriority is None or not hasattr(threading, "get_native_id"):
        return -1
    thread_id = threading.get_native_id()
    try:
        current = os.getpriority(os.PRIO_PROCESS, thread_id)
        setpriority(os.PRIO_PROCESS, thread_id, min(19, current + by))
        return os.getpriority(os.PRIO_PROCESS, thread_id)
    except OSError:
        return -1


async def lower_writer_priority(writer: aiosqlite.Connection, by: int) -> None:
    """Lowers the scheduling priority of the thread that runs ``writer``'s
    statements by ``by`` nice levels (0: unchanged). The call is made from
    inside that thread, as an SQL function: aiosqlite runs every statement
    of a connection on one thread of its own."""
    if by <= 0:
        return
    await writer.create_function("gridstream_lower_priority", 0,
                                 lambda: _lower_calling_thread(by))
    rows = list(await writer.execute_fetchall("SELECT gridstream_lower_priority()"))
    niceness = int(rows[0][0]) if rows else -1
    if niceness >= 0:
        log.info("the SQLite writer thread runs at niceness %d (stateserver.writer_niceness "
                 "= %d): event loops get contended cores first", niceness, by)
    else:
        log.info("the SQLite writer thread could not be reprioritised on this platform")
