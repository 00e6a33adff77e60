"""Pure ASGI middleware: a body-size limit that answers 413 before the app reads a byte (and 408
for a body sent too slowly), HEAD answered as GET without a body, security headers on every
response, whose redirects never name a host the client sent, memory given back after any
request that left the process larger, the Host names served without a token (``LocalHosts``), and the
connection's transport handed to the response that tunes it (``KeepTransport``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from ipaddress import ip_address
from urllib.parse import urlsplit

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.errors import Loc, error_item, error_json
from app.lanes import SPOOLED_BODY, Spooled, trim_if_grown

# The pages load only their own scripts and styles (plotly.js and Swagger UI are served locally);
# Plotly and Swagger UI set inline styles and draw icons from data: URIs.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; "
    "font-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; "
    "form-action 'self'"
)
SECURITY_HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    (b"content-security-policy", CSP.encode()),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"permissions-policy", b"camera=(), microphone=(), geolocation=()"),
]


class SecurityHeaders:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(n, _local(v) if n == b"location" else v) for n, v in message.get("headers", [])]
                names = {name for name, _ in headers}
                message["headers"] = headers + [(n, v) for n, v in SECURITY_HEADERS if n not in names]
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _local(location: bytes) -> bytes:
    """A redirect's target as a path: ``http://evil.example/static/`` (built from the Host header) -> ``/static/``."""
    parts = urlsplit(location.decode("latin-1"))
    if not parts.scheme and not parts.netloc:
        return location
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return path.encode("latin-1")


LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
TRANSPORT = "grpo_lens.transport"  # the scope's key for the connection's asyncio transport (or None)


class LocalHosts:
    """An instance without a token, and without ``allowed_hosts``, serves only the Host names a page on
    another site cannot take over by DNS rebinding: the loopback names, and the address the connection
    came in on (the bound host: an IP address, which no attacker's DNS answers for); any other gets a
    400 naming the setting, but for ``/healthz`` (a probe may name the host as it likes; it reads nothing).
    Serving a LAN by name: set ``allowed_hosts`` (or a token)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] == "/healthz":
            await self.app(scope, receive, send)
            return
        host = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
        if _local_host(host, scope.get("server")):
            await self.app(scope, receive, send)
            return
        msg = (
            f"this server answers to its loopback names and its own address, not {host[:100]!r}: "
            "set the allowed_hosts setting (GRPO_LENS_ALLOWED_HOSTS) to serve that name"
        )
        await _refuse(send, 400, msg, "invalid_host", ["header", "host"])


def _local_host(host: str, server: tuple[str, int | None] | None) -> bool:
    """Whether ``host`` (a Host header) names a loopback address or ``server``'s own (the scope's server)."""
    if not host:  # HTTP/1.0 without Host: no browser sends that
        return True
    try:
        name = urlsplit(f"http://{host}").hostname
    except ValueError:
        return False
    if not name:
        return False
    if name in LOOPBACK_NAMES or (server is not None and name == str(server[0]).lower()):
        return True
    try:
        return ip_address(name).is_loopback
    except ValueError:
        return False


class KeepTransport:
    """Puts the connection's asyncio transport in the scope under ``TRANSPORT`` (uvicorn's; None under a
    test transport or another server), for a response that tunes its own connection (an event stream
    shrinks its buffers, so a reader that takes nothing is found stalled within a bounded amount of data).
    Added outermost, where ``send`` is still the server's own."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope[TRANSPORT] = getattr(getattr(send, "__self__", None), "transport", None)
        await self.app(scope, receive, send)


class HeadAsGet:
    """HEAD answered as the GET of the same address, without its body: HTTP has every GET resource
    answer HEAD (uptime checks and ``curl -I`` send it), and FastAPI's routes take only the methods
    they name. An event stream (``.../events``) never ends by itself, so HEAD there stays a 405."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD" or scope["path"].endswith("/events"):
            await self.app(scope, receive, send)
            return

        async def headers_only(message: Message) -> None:
            if message["type"] == "http.response.body":
                if message.get("more_body", False):
                    return
                message = {"type": "http.response.body", "body": b"", "more_body": False}
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, headers_only)


class TrimWhenGrown:
    """After every response: when the process has grown since its last heap trim (any route: a run
    listing, a download, an export, an upload), its freed memory goes back to the OS once it has been
    idle ``idle`` seconds (``app.lanes.trim_if_grown``). Costs one read of /proc per request."""

    def __init__(self, app: ASGIApp, idle: float) -> None:
        self.app = app
        self.idle = idle

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.app(scope, receive, send)
        finally:
            if scope["type"] == "http":
                trim_if_grown(self.idle)


class BodyLimit:
    """Reads the body up to ``limit(path)`` bytes, then replays it to the app; past it, a 413.

    A Content-Length over the limit is refused before anything is read; a chunked body is
    refused as soon as it passes the limit. The server keeps answering other requests.

    A body of ``spool_bytes`` or more is written to a file as it arrives (``app.lanes.Spooled``), never
    joined in this process's memory: a route that hands its body to a lane takes the file
    (``app.lanes.take_spooled``) and a worker process reads it; any other route reads it back through
    ``receive`` as usual (in a thread).
    """

    def __init__(
        self,
        app: ASGIApp,
        limit: Callable[[str], int],
        timeout: float = 60.0,
        spool_bytes: int | None = None,
        before_large_chunk: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.app = app
        self.before_large_chunk = before_large_chunk
        self.limit = limit
        self.timeout = timeout
        self.spool_bytes = spool_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        limit = self.limit(scope["path"])
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            await _too_large(send, int(length), limit)
            return
        body = _Body(self.spool_bytes)
        try:
            await self._read(scope, receive, send, limit, body)
        finally:
            body.discard()  # the spool file, if a worker did not read it (an error, a disconnect, a refusal)

    async def _read(self, scope: Scope, receive: Receive, send: Send, limit: int, body: _Body) -> None:
        more = True
        with anyio.move_on_after(self.timeout) as deadline:  # a client that sends too slowly is dropped
            while more:
                if body.spooled is not None and self.before_large_chunk is not None:
                    await self.before_large_chunk()  # small requests first (app.small_first)
                message = await receive()
                if message["type"] == "http.disconnect":
                    return
                body.add(message.get("body", b""))
                more = message.get("more_body", False)
                if body.size > limit:
                    await _too_large(send, body.size, limit)
                    return
        if deadline.cancelled_caught:
            msg = f"the body did not arrive within {self.timeout:g} s (a setting); {body.size} bytes came"
            await _refuse(send, 408, msg, "timeout")
            return
        await self.app(body.hand_over(scope), body.replay(receive), send)


class _Body:
    """A request's body as it arrives: chunks joined once at the end (a copy while this process holds the
    GIL), or, from ``spool_bytes`` on, written to a spool file chunk by chunk."""

    def __init__(self, spool_bytes: int | None) -> None:
        self.spool_bytes = spool_bytes
        self.chunks: list[bytes] = []
        self.size = 0
        self.spooled: Spooled | None = None

    def add(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.spooled is not None:
            self.spooled.append(chunk)
            return
        self.chunks.append(chunk)
        if self.spool_bytes is not None and self.size >= max(self.spool_bytes, 1):
            self.spooled = Spooled()  # the chunks so far go first; the rest follow as they come
            for held in self.chunks:
                self.spooled.append(held)
            self.chunks.clear()

    def hand_over(self, scope: Scope) -> Scope:
        """The scope the app sees: a spooled body rides in it under ``SPOOLED_BODY``."""
        if self.spooled is None:
            return scope
        self.spooled.finish()
        return {**scope, SPOOLED_BODY: self.spooled}

    def replay(self, receive: Receive) -> Receive:
        """The app's ``receive``: the whole body in one message (a spooled one read back in a thread, unless
        a route took the file), then the client's own messages (a disconnect)."""
        body = b"".join(self.chunks)
        self.chunks.clear()
        spooled, replayed = self.spooled, False

        async def replayed_receive() -> Message:
            nonlocal body, replayed
            if replayed:
                return await receive()
            replayed = True
            if spooled is not None and not spooled.taken:
                body = await anyio.to_thread.run_sync(spooled.read)
            message: Message = {"type": "http.request", "body": body, "more_body": False}
            body = b""
            return message

        return replayed_receive

    def discard(self) -> None:
        if self.spooled is not None:
            self.spooled.discard()


async def _too_large(send: Send, size: int, limit: int) -> None:
    await _refuse(send, 413, f"request body of {size}+ bytes; at most {limit} bytes (a setting)", "too_large")


async def _refuse(send: Send, status: int, msg: str, kind: str, loc: Loc | None = None) -> None:
    """An error answer, and the connection closed (the rest of the body is not read)."""
    payload = error_json([error_item(loc or ["body"], msg, kind)])
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})
