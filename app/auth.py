"""Only the team gets in: an optional shared secret (``GRPO_LENS_AUTH_TOKEN``).

When it is set, every route but ``/healthz`` and the sign-in/out forms asks for it: the API as
``Authorization: Bearer <token>`` (401 JSON otherwise), the browser as a session cookie set by the
sign-in page (HttpOnly, SameSite=Strict, Secure over HTTPS).

A session is ``<id>.<expiry>.<signature>``: a random id, the Unix second it ends
(``GRPO_LENS_SESSION_TTL`` after sign-in) and an HMAC of both under a key derived from the token, so
a new token invalidates every cookie of the old one. The id must also be in this process's table of
live sessions (``Sessions``): sign-out removes it, so a copied cookie dies with its sign-out, and a
restart signs everyone out (nothing is written to disk). The table is per process and bounded
(``GRPO_LENS_MAX_SESSIONS``): past it the least recently *used* session ends, so a flood of sign-ins ends
only sessions left idle longer than the flood took; and one address's sign-in attempts are rate-limited
(``SignInRate``, ``GRPO_LENS_SIGNIN_PER_MINUTE``: a 429 with Retry-After beyond), so that flood is slow.

SameSite=Strict keeps other *sites* from riding the cookie, not other origins of the same site (another
port, a sibling subdomain). So a cookie-signed-in request other than GET/HEAD, and every POST to the
sign-in and sign-out forms, must come from this origin: an ``Origin`` equal to the request's own
``scheme://host[:port]`` (the scheme as the trusted proxy forwarded it), or ``Sec-Fetch-Site:
same-origin``; else a 403. Clients that send neither header (curl, Python) are not browsers and pass;
so do bearer-token requests, which no other origin can make a browser send. Without a token,
``SameOriginWrites`` makes the same check of every request other than GET/HEAD/OPTIONS: there is no
credential to ride, but a cross-site form could still plant or delete runs.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import re
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection
from typing import Any
from urllib.parse import quote, urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from app.errors import error_item, error_json

COOKIE = "grpo_lens_session"
OPEN_PATHS = ("/healthz", "/signin", "/signout")
FORMS = ("/signin", "/signout")  # open, but a cross-origin POST could sign a browser in or out: same-origin only
SAFE_METHODS = ("GET", "HEAD")
DEFAULT_PORTS = {"http": 80, "https": 443}
# id (18 random bytes, URL-safe base64) . expiry (Unix seconds) . HMAC-SHA256 (hex); ASCII only, nothing else.
SESSION = re.compile(r"([A-Za-z0-9_-]{24})\.([0-9]{1,12})\.([0-9a-f]{64})")


def token_matches(given: str, token: str) -> bool:
    """Constant time, its length too: the digests of both are compared, never the strings."""
    digest = hashlib.sha256
    return hmac.compare_digest(digest(given.encode()).digest(), digest(token.encode()).digest())


def signing_key(token: str) -> bytes:
    """The sessions' key: derived from the token, so changing the token ends every session."""
    return hmac.new(token.encode(), b"grpo-lens session key v1", hashlib.sha256).digest()


class Sessions:
    """The signed sessions this process has started and not yet ended: id -> expiry (Unix seconds).

    ``table`` is in order of last use (a request a session lets in moves it to the end); ``started`` holds
    the same sessions in order of start, which is their order of expiry (each lasts ``ttl``). A full
    table drops the expired first, then the least recently used. ``clock`` is injectable (tests move
    time); the lock makes the table safe from route threads.
    """

    def __init__(
        self, token: str, ttl: int = 12 * 3600, limit: int = 10_000, clock: Callable[[], float] = time.time
    ) -> None:
        self.key = signing_key(token)
        self.ttl = ttl
        self.limit = limit
        self.clock = clock
        self.table: OrderedDict[str, int] = OrderedDict()  # the least recently used first
        self.started: OrderedDict[str, int] = OrderedDict()  # the first to expire first
        self.lock = threading.Lock()

    def sign(self, sid: str, expires: int) -> str:
        return hmac.new(self.key, f"{sid}.{expires}".encode(), hashlib.sha256).hexdigest()

    def start(self) -> str:
        """A new session; its cookie value. Expired sessions are dropped first, then, if the table is
        still full, the least recently used (that sign-in ends: failing closed keeps the table bounded)."""
        now = self.clock()
        sid, expires = secrets.token_urlsafe(18), int(now) + self.ttl
        with self.lock:
            while self.started and next(iter(self.started.values())) <= now:
                expired, _ = self.started.popitem(last=False)
                self.table.pop(expired, None)
            while len(self.table) >= self.limit:
                idle, _ = self.table.popitem(last=False)
                self.started.pop(idle, None)
            self.table[sid] = self.started[sid] = expires
        return f"{sid}.{expires}.{self.sign(sid, expires)}"

    def signed(self, value: str) -> tuple[str, int] | None:
        """``(id, expiry)`` of a well-formed value signed with this token's key, else None."""
        match = SESSION.fullmatch(value)
        if match is None or not hmac.compare_digest(match[3], self.sign(match[1], int(match[2]))):
            return None
        return match[1], int(match[2])

    def check(self, value: str) -> str | None:
        """The session id of a live cookie value, else None: signed with this token's key, not expired,
        and not ended here (signed out, or started before this process)."""
        signed = self.signed(value)
        if signed is None:
            return None
        sid, expires = signed
        with self.lock:
            if self.clock() >= expires:  # ended by time: its entry goes too
                self.table.pop(sid, None)
                self.started.pop(sid, None)
                return None
            if self.table.get(sid) != expires:
                return None
            self.table.move_to_end(sid)  # used now: the last a full table would end
            return sid

    def end(self, value: str) -> bool:
        """Ends the session a cookie value names (sign-out); whether it was live. Only a correctly
        signed value can end one, so nobody ends another's session by guessing its id."""
        signed = self.signed(value)
        if signed is None:
            return False
        with self.lock:
            self.started.pop(signed[0], None)
            return self.table.pop(signed[0], None) is not None


class SignInRate:
    """Sign-in attempts per client address: a bucket of ``per_minute`` that refills at ``per_minute`` a
    minute, so a person who mistypes signs in at once and a flood gets one attempt in ``60 / per_minute``
    seconds. The addresses are kept in order of last attempt, at most ``max_addresses`` (the longest
    quiet go first: their buckets are full again anyway, or nearly)."""

    def __init__(
        self, per_minute: int, clock: Callable[[], float] = time.monotonic, max_addresses: int = 65_536
    ) -> None:
        self.capacity, self.rate = float(per_minute), per_minute / 60.0
        self.clock = clock
        self.max_addresses = max_addresses
        self.buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # address -> (tokens, when)
        self.lock = threading.Lock()

    def take(self, address: str) -> float:
        """0 when ``address`` may try now (the attempt is counted), else the seconds until it may."""
        now = self.clock()
        with self.lock:
            tokens, then = self.buckets.pop(address, (self.capacity, now))
            tokens = min(self.capacity, tokens + (now - then) * self.rate)
            wait = 0.0 if tokens >= 1 else (1 - tokens) / self.rate
            self.buckets[address] = (tokens - 1 if wait == 0 else tokens, now)
            while len(self.buckets) > self.max_addresses:
                self.buckets.popitem(last=False)
        return wait


def cookie_values(header: str) -> list[str]:
    """Every value the ``Cookie`` header gives the session cookie (a sibling subdomain can add one)."""
    values = []
    for part in header.split(";"):
        name, _, value = part.strip().partition("=")
        if name == COOKIE:
            values.append(value)
    return values


def safe_next(target: str | None) -> str:
    """Where to go after signing in: a path on this site, never another host."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


def _origin(scheme: str, netloc: str) -> tuple[str, str, int] | None:
    """``(scheme, host, port)`` with the scheme's default port filled in; None when it does not parse."""
    try:
        parts = urlsplit(f"{scheme}://{netloc}")
        port = parts.port or DEFAULT_PORTS.get(scheme.lower())
    except ValueError:
        return None
    if not parts.hostname or port is None:
        return None
    return scheme.lower(), parts.hostname.lower(), port


def same_origin(scope: Scope, headers: dict[str, str]) -> bool:
    """Whether a browser sent this request from this origin, or no browser sent it at all.

    ``Sec-Fetch-Site`` is set by the browser (no script can forge it) and survives a proxy that rewrites
    ``Host``; ``Origin`` is compared with the request's own scheme (after the trusted proxy's
    ``X-Forwarded-Proto``) and ``Host``."""
    fetch_site, origin = headers.get("sec-fetch-site"), headers.get("origin")
    if fetch_site == "same-origin":
        return True
    if origin is not None:
        scheme, _, netloc = origin.partition("://")
        own = _origin(scope["scheme"], headers.get("host", ""))
        return own is not None and _origin(scheme, netloc) == own
    return fetch_site is None


def cross_origin(headers: dict[str, str]) -> dict[str, Any]:
    """The 403's entry for a browser request from another origin."""
    origin = headers.get("origin", headers.get("sec-fetch-site", ""))[:100]
    msg = (
        f"refused: a browser request from another origin ({origin!r}) that could change something; the page's "
        "own requests come from this origin, and API clients send no Origin (or 'Authorization: Bearer <token>')"
    )
    return error_item(["header", "origin"], msg, "cross_origin")


class SameOriginWrites:
    """Pure ASGI middleware for an instance without a token: a request other than GET/HEAD/OPTIONS that a
    browser sent from another origin (``same_origin``), and not from one of ``cors_origins``, gets a 403.

    A cross-site form post or fetch always carries ``Origin`` (and ``Sec-Fetch-Site``), so a present,
    foreign one is refused; clients that send neither (curl, httpx, the CLI) are no browser and pass."""

    def __init__(self, app: ASGIApp, cors_origins: Collection[str] = ()) -> None:
        self.app = app
        self.cors_origins = {o.rstrip("/").lower() for o in cors_origins}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] not in (*SAFE_METHODS, "OPTIONS"):
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
            allowed = headers.get("origin", "").lower() in self.cors_origins
            if not allowed and not same_origin(scope, headers):
                await _error(send, 403, cross_origin(headers))
                return
        await self.app(scope, receive, send)


class RequireToken:
    """Pure ASGI middleware: a request without the token gets a 401 (API) or the sign-in page (browser);
    a cookie-signed-in request that could change something, from another origin, a 403; sign-in attempts
    past ``signins``' rate from one address, a 429 with Retry-After."""

    def __init__(
        self, app: ASGIApp, token: str, sessions: Sessions | None = None, signins: SignInRate | None = None
    ) -> None:
        self.app = app
        self.token = token
        self.sessions = sessions or Sessions(token)
        self.signins = signins

    def credential(self, headers: dict[str, str]) -> str | None:
        """``bearer``, ``cookie`` (a live session), or None."""
        scheme, _, given = headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and token_matches(given.strip(), self.token):
            return "bearer"
        if any(self.sessions.check(value) for value in cookie_values(headers.get("cookie", ""))):
            return "cookie"
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        path, method = scope["path"], scope["method"]
        kind = "open" if path in OPEN_PATHS else self.credential(headers)
        if kind is None:
            await self.refuse(scope, headers, send)
            return
        ridden = kind == "cookie" or path in FORMS  # what another origin's page could make a browser send
        if method not in SAFE_METHODS and ridden and not same_origin(scope, headers):
            await _error(send, 403, cross_origin(headers))
            return
        if path == "/signin" and method == "POST" and self.signins is not None:
            wait = self.signins.take(scope["client"][0] if scope.get("client") else "")
            if wait:
                seconds = math.ceil(wait)
                msg = (
                    f"too many sign-in attempts from this address: retry in {seconds} s (the setting signin_per_minute)"
                )
                item = error_item(["body", "token"], msg, "rate_limited")
                await _error(send, 429, item, ((b"retry-after", str(seconds).encode()),))
                return
        await self.app(scope, receive, send)

    async def refuse(self, scope: Scope, headers: dict[str, str], send: Send) -> None:
        """To the sign-in page for a person at a browser (then back here); a 401 for everyone else."""
        api = scope["path"].startswith("/api/")
        if scope["method"] == "GET" and not api and "text/html" in headers.get("accept", ""):
            query = scope["query_string"].decode("latin-1")
            location = "/signin?next=" + quote(scope["path"] + ("?" + query if query else ""), safe="/")
            await send({"type": "http.response.start", "status": 303, "headers": [(b"location", location.encode())]})
            await send({"type": "http.response.body", "body": b""})
            return
        msg = "sign in: send the team's token as 'Authorization: Bearer <token>' (or sign in at /signin)"
        item = error_item(["header", "authorization"], msg, "unauthorized")
        await _error(send, 401, item, ((b"www-authenticate", b'Bearer realm="grpo-lens"'),))


async def _error(send: Send, status: int, item: dict[str, Any], extra: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    body = error_json([item])
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
