"""A small HTTP(S) server for the web console, on asyncio streams.

It serves three things: the page (``/``), its static files
(``/static/NAME``, shipped inside the package) and the JSON document the
page polls (``/api/state``). One request per connection, GET and HEAD only,
bounded request size and time: a browser polling once a second needs no more,
and no web framework is added to the scheduler.

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
"""Largest request head accepted."""
REQUEST_TIMEOUT_S = 10.0
"""Time a client has to send its request head."""
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
        self._server = await asyncio.start_server(self._accept, host, port, ssl=context,
                                                  limit=MAX_HEADER_BYTES)
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
        self._connections.add(task)
        try:
            await self._serve(reader, writer)
        except (ConnectionError, TimeoutError, asyncio.IncompleteReadError,
                asyncio.LimitOverrunError, ssl.SSLError):
            pass
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REQUEST_TIMEOUT_S)
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
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
            return
        url = urlsplit(target)
        query = parse_qs(url.query)
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
    await writer.drain()
