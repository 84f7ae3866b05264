"""A TCP proxy that can cut a link: network partitions for tests and chaos runs.

``tc netem`` is not available everywhere, and a partition between one worker
and the scheduler (while the worker still reaches its peers) cannot be made
with signals. Put this proxy between the two: :meth:`FaultProxy.cut` closes
every connection through it and refuses new ones (both directions go quiet,
as with a dropped link), :meth:`FaultProxy.heal` lets connections through
again. Owned by whoever starts it; :meth:`close` stops it and every pipe.
"""

from __future__ import annotations

import asyncio
import contextlib


class FaultProxy:
    """Forwards ``127.0.0.1:<port>`` to ``upstream`` until cut."""

    def __init__(self, upstream: str) -> None:
        host, _, port = upstream.rpartition(":")
        self.upstream_host, self.upstream_port = host, int(port)
        self.address = ""
        self.cut_now = False
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> FaultProxy:
        """Listens on a free loopback port (:attr:`address`)."""
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.address = f"127.0.0.1:{port}"
        return self

    def cut(self) -> None:
        """Drops every connection and refuses new ones until :meth:`heal`."""
        self.cut_now = True
        for writer in list(self._writers):
            writer.transport.abort()

    def heal(self) -> None:
        """Lets connections through again."""
        self.cut_now = False

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.cut_now:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(self.upstream_host,
                                                                 self.upstream_port)
        except OSError:
            writer.transport.abort()
            return
        self._writers |= {writer, up_writer}
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pipe(source, sink))
            self._pipes.add(task)
            task.add_done_callback(self._pipes.discard)

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        try:
            while data := await source.read(65536):
                if self.cut_now:
                    break
                sink.write(data)
                await sink.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            self._writers.discard(sink)
            sink.transport.abort()

    async def close(self) -> None:
        """Stops listening, then cancels and awaits every pipe."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for writer in list(self._writers):
            writer.transport.abort()
        for task in list(self._pipes):
            task.cancel()
        for task in list(self._pipes):
            with contextlib.suppress(asyncio.CancelledError):
                await task
