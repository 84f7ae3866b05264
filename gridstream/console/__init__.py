"""The web console the scheduler serves: a page with no build step (plain
HTML, JavaScript and CSS shipped in ``static/``) that polls one JSON document.
The HTTP server is :class:`ConsoleServer`; what the document holds is the
scheduler's business (``services.scheduler.console_view``)."""

from gridstream.console.server import ConsoleServer, static_file

__all__ = ["ConsoleServer", "static_file"]
