"""A small HTTP(S) server for the web console, on asyncio streams.

It serves three things: the page (``/``), its static files
(``/static/NAME``, shipped inside the package) and the JSON document the
page polls (``/api/state``). One request per connection, GET and HEAD only:
a browser polling once a second needs no more, and no web framework is added
to the scheduler.

Every caller is untrusted, and the server runs inside the scheduler, so each
connection is bounded: its request head in size (``MAX_HEADER_BYTES``, else
431; a request line over ``MAX_TARGET_BYTES``, 414) and in time (the whole
head within ``REQUEST_TIMEOUT_S``, however slowly it trickles in, else 408),
the answer in time (``WRITE_TIMEOUT_S`` for a reader that does not read), and
the connections open at once (``MAX_CONNECTIONS``, beyond which a caller gets
503 at once). Anything malformed gets 400, any other method 405; whatever
happens in one connection is logged and closes that connection only.

Security follows the cluster's: with ``security.tls`` it speaks HTTPS with
the member certificate (requiring a client certificate from ``ca_file``
when ``require_client_cert`` is set and no tokens are configured); with
``security.tokens_file`` every request needs a token with the ``read`` (or
``admin``) right, as an ``Authorization: Bearer`` header, a ``?token=`` query
(answered with a redirect that stores it in an HttpOnly cookie) or that
cookie. Anything else is answered 401.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import ssl
from collections.abc import Callable, Mapping
from http import HTTPStatus
from http.cookies import CookieError, SimpleCookie
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

from gridstream.auth import load_tokens
from gridstream.config import SecurityConfig

log = logging.getLogger(__name__)

COOKIE = "gridstream_token"
"""Cookie holding the console token after a ``?token=`` visit."""
MAX_HEADER_BYTES = 16 * 1024
"""Largest request head accepted (431 beyond)."""
MAX_TARGET_BYTES = 4 * 1024
"""Longest request line accepted (414 beyond): the console's own addresses
are short; only a token or a window ride in the query."""
REQUEST_TIMEOUT_S = 5.0
"""Time a client has to send its whole request head (408 after): a browser
sends it at once; a slow trickle of bytes does not extend it."""
WRITE_TIMEOUT_S = 10.0
"""Time an answer has to leave: a caller that never reads is dropped."""
MAX_CONNECTIONS = 64
"""Connections served at once; more get 503 and are closed at once, so a
flood of idle sockets costs the scheduler bounded memory and time."""
_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
          ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
_NAME = re.compile(r"^[a-z0-9_-]+\.(html|js|css|svg)$")
_LOCAL_PATH = re.compile(r"^/(?!/)[A-Za-z0-9/._-]*$")
"""A redirect after ``?token=`` stays on this server."""
_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
                               "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}

StateFunction = Callable[[Mapping[str, list[str]]], dict[str, Any]]
"""Builds the JSON document from the request's query."""


def static_file(name: str) -> bytes | None:
    """A file of the page shipped in the package, or None (never a path
    outside ``gridstream/console/static``)."""
    if not _NAME.match(name):
        return None
    item = resources.files("gridstream.console").joinpath("static", name)
    try:
        return item.read_bytes()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None


def server_ssl_context(security: SecurityConfig) -> ssl.SSLContext | None:
    """HTTPS with the member certificate when the cluster uses TLS."""
    if not security.tls:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(security.cert_file, security.key_file)
    if security.require_client_cert and not security.tokens_file:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(security.ca_file)
    return context


class ConsoleServer:
    """Serves the console until :meth:`stop`; every connection's task is
    owned here, cancelled and awaited on stop."""

    def __init__(self, state: StateFunction, security: SecurityConfig | None = None) -> None:
        self.state = state
        self.security = security or SecurityConfig()
        self.tokens = (load_tokens(self.security.tokens_file) if self.security.tokens_file
                       else None)
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self.url = ""

    async def start(self, host: str, port: int) -> str:
        """Binds and serves; returns the console's URL."""
        context = server_ssl_context(self.security)
        self._server = await asyncio.start_server(
            self._accept, host, port, ssl=context, limit=MAX_HEADER_BYTES,
            ssl_handshake_timeout=REQUEST_TIMEOUT_S if context else None)
        bound = self._server.sockets[0].getsockname()[1]
        shown = f"[{host}]" if ":" in host else host
        self.url = f"{'https' if context else 'http'}://{shown}:{bound}/"
        return self.url

    async def stop(self) -> None:
        """Stops accepting, then cancels and awaits open connections."""
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        for task in list(self._connections):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        busy = len(self._connections) >= MAX_CONNECTIONS
        self._connections.add(task)
        try:
            if busy:
                await _send(writer, HTTPStatus.SERVICE_UNAVAILABLE,
                            f"{MAX_CONNECTIONS} connections are open; retry later\n".encode(),
                            extra={"Retry-After": "1"})
                await _linger(reader, writer)  # the answer first, not a reset
                return
            await self._serve(reader, writer)
        except asyncio.CancelledError:
            raise
        except (ConnectionError, TimeoutError, asyncio.IncompleteReadError, ssl.SSLError):
            pass
        except Exception:  # one caller's request must never reach the scheduler
            log.exception("console request failed; closing its connection")
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), WRITE_TIMEOUT_S)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REQUEST_TIMEOUT_S)
        except TimeoutError:
            await _send(writer, HTTPStatus.REQUEST_TIMEOUT,
                        f"send the request head within {REQUEST_TIMEOUT_S:.0f} s\n".encode())
            return
        except asyncio.LimitOverrunError:
            await _send(writer, HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE,
                        f"the request head is over {MAX_HEADER_BYTES} bytes\n".encode())
            await _linger(reader, writer)
            return
        except asyncio.IncompleteReadError:
            return  # the caller closed before a whole head: nobody to answer
        lines = head.decode("latin-1").split("\r\n")
        if len(lines[0]) > MAX_TARGET_BYTES:
            await _send(writer, HTTPStatus.REQUEST_URI_TOO_LONG,
                        f"the request line is over {MAX_TARGET_BYTES} bytes\n".encode())
            await _linger(reader, writer)
            return
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1.") or not parts[0].isalpha():
            await _send(writer, HTTPStatus.BAD_REQUEST, b"bad request\n")
            return
        method, target = parts[0], parts[1]
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        if method not in ("GET", "HEAD"):
            await _send(writer, HTTPStatus.METHOD_NOT_ALLOWED, b"GET only\n",
                        extra={"Allow": "GET, HEAD"})
            await _linger(reader, writer)
            return
        try:
            url = urlsplit(target)
            query = parse_qs(url.query, max_num_fields=20)
        except ValueError:
            await _send(writer, HTTPStatus.BAD_REQUEST, b"bad request target\n")
            return
        status, body, content_type, extra = self._answer(url.path, query, headers)
        await _send(writer, status, body, content_type, extra, head_only=method == "HEAD")

    def _token_rights(self, token: str) -> frozenset[str]:
        assert self.tokens is not None
        return self.tokens.get(token, frozenset())

    def _answer(self, path: str, query: Mapping[str, list[str]], headers: Mapping[str, str]
                ) -> tuple[HTTPStatus, bytes, str, dict[str, str]]:
        if self.tokens is not None:
            offered = query.get("token", [""])[0]
            if offered:
                if {"read", "admin"} & self._token_rights(offered):
                    cookie = (f"{COOKIE}={quote(offered, safe='')}; Path=/; HttpOnly; "
                              "SameSite=Strict" + ("; Secure" if self.security.tls else ""))
                    back = path if _LOCAL_PATH.match(path) else "/"
                    return (HTTPStatus.SEE_OTHER, b"", "text/plain",
                            {"Location": back, "Set-Cookie": cookie})
                return _unauthorized("unknown token, or one without the read right")
            if not {"read", "admin"} & self._token_rights(_presented(headers)):
                return _unauthorized("this console needs a token with the read right")
        if path in ("/", "/index.html"):
            body = static_file("index.html")
            if body is not None:
                return HTTPStatus.OK, body, _TYPES[".html"], {}
        elif path.startswith("/static/"):
            name = path[len("/static/"):]
            body = static_file(name)
            if body is not None:
                return HTTPStatus.OK, body, _TYPES["." + name.rsplit(".", 1)[1]], {}
        elif path == "/api/state":
            try:
                document = self.state(query)
            except Exception:
                log.exception("console state failed")
                return (HTTPStatus.INTERNAL_SERVER_ERROR,
                        b'{"error": "the console state failed; see the scheduler log"}',
                        "application/json", {})
            return (HTTPStatus.OK, json.dumps(document, allow_nan=False).encode(),
                    "application/json", {})
        return HTTPStatus.NOT_FOUND, b"not found\n", "text/plain; charset=utf-8", {}


def _presented(headers: Mapping[str, str]) -> str:
    """The token of a request: the bearer header, else the console cookie."""
    authorization = headers.get("authorization", "")
    if authorization.lower().startswith("bearer "):
        return authorization[7:].strip()
    try:
        cookies = SimpleCookie(headers.get("cookie", ""))
    except CookieError:
        return ""
    morsel = cookies.get(COOKIE)
    return unquote(morsel.value) if morsel is not None else ""


def _unauthorized(why: str) -> tuple[HTTPStatus, bytes, str, dict[str, str]]:
    text = (f"401: {why}. Open this address with ?token=<token> once (a cookie keeps it), "
            "or send Authorization: Bearer <token>. Tokens: security.tokens_file.\n")
    return (HTTPStatus.UNAUTHORIZED, text.encode(), "text/plain; charset=utf-8",
            {"WWW-Authenticate": 'Bearer realm="gridstream"'})


async def _send(writer: asyncio.StreamWriter, status: HTTPStatus, body: bytes,
                content_type: str = "text/plain; charset=utf-8",
                extra: Mapping[str, str] | None = None, head_only: bool = False) -> None:
    head = [f"HTTP/1.1 {status.value} {status.phrase}", f"Content-Type: {content_type}",
            f"Content-Length: {len(body)}", "Connection: close",
            *(f"{k}: {v}" for k, v in {**_HEADERS, **(extra or {})}.items())]
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
    if not head_only:
        writer.write(body)
    await asyncio.wait_for(writer.drain(), WRITE_TIMEOUT_S)


async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """After answering a request whose body was not read (a POST), ends the
    answer and reads a bounded amount of what is left, briefly, so that
    closing does not reset the connection before the caller reads the answer."""
    with contextlib.suppress(Exception):
        if writer.can_write_eof():
            writer.write_eof()
        await asyncio.wait_for(reader.read(MAX_HEADER_BYTES * 4), 1.0)
