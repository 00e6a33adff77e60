"""Only the team gets in: an optional shared secret (``GRPO_LENS_AUTH_TOKEN``).

When it is set, every route but ``/healthz`` and the sign-in page asks for it: the API as
``Authorization: Bearer <token>`` (401 JSON otherwise), the browser as a cookie set by the sign-in
page (HttpOnly, SameSite=Strict, Secure over HTTPS). The cookie holds an HMAC of the token, not the
token; both are compared in constant time.
"""

from __future__ import annotations

import hashlib
import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from app.errors import error_item, error_json

COOKIE = "grpo_lens_session"
OPEN_PATHS = ("/healthz", "/signin")


def session_value(token: str) -> str:
    """What the sign-in cookie holds: an HMAC of the token (the token itself never leaves the form)."""
    return hmac.new(token.encode(), b"grpo-lens sign-in", hashlib.sha256).hexdigest()


def token_matches(given: str, token: str) -> bool:
    """Constant time, its length too: the digests of both are compared, never the strings."""
    digest = hashlib.sha256
    return hmac.compare_digest(digest(given.encode()).digest(), digest(token.encode()).digest())


def _cookie(header: str) -> str:
    for part in header.split(";"):
        name, _, value = part.strip().partition("=")
        if name == COOKIE:
            return value
    return ""


def safe_next(target: str | None) -> str:
    """Where to go after signing in: a path on this site, never another host."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


class RequireToken:
    """Pure ASGI middleware: a request without the token gets a 401 (API) or the sign-in page (browser)."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token
        self.session = session_value(token)

    def allowed(self, scope: Scope) -> bool:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        scheme, _, given = headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and token_matches(given.strip(), self.token):
            return True
        return token_matches(_cookie(headers.get("cookie", "")), self.session)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS or self.allowed(scope):
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        page = (
            scope["method"] == "GET"
            and not scope["path"].startswith("/api/")
            and b"text/html" in headers.get(b"accept", b"")
        )
        if page:  # a person at a browser: to the sign-in page, then back here
            target = scope["path"] + ("?" + scope["query_string"].decode("latin-1") if scope["query_string"] else "")
            from urllib.parse import quote

            location = "/signin?next=" + quote(target, safe="/")
            await send({"type": "http.response.start", "status": 303, "headers": [(b"location", location.encode())]})
            await send({"type": "http.response.body", "body": b""})
            return
        msg = "sign in: send the team's token as 'Authorization: Bearer <token>' (or sign in at /signin)"
        body = error_json([error_item(["header", "authorization"], msg, "unauthorized")])
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", b'Bearer realm="grpo-lens"'),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
