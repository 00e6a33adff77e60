"""Only the team gets in: the shared token (bearer for the API, a sign-in cookie for the browser),
trusted hosts, and forwarded headers trusted only from the configured proxies. In process (ASGI),
each test on an app built by ``create_app`` with its own settings."""

from __future__ import annotations

import pytest
from api_fixtures import ARTICLE
from fastapi.testclient import TestClient

from app.auth import COOKIE, SESSION
from app.main import create_app
from app.settings import Settings

TOKEN = "team-secret-4f2a"
BEARER = {"authorization": f"Bearer {TOKEN}"}
HTML = {"accept": "text/html"}


def guarded(**settings: object) -> TestClient:
    return TestClient(create_app(Settings(auth_token=TOKEN, **settings)), follow_redirects=False)


@pytest.fixture(scope="module")
def api() -> TestClient:
    return guarded()


def test_healthz_is_open(api: TestClient) -> None:
    assert api.get("/healthz").json()["status"] == "ok"


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/api/v1/loss"),
        ("POST", "/api/v1/compare"),
        ("POST", "/api/v1/upload"),
        ("GET", "/api/v1/options"),
        ("GET", "/api/v1/experiments"),
        ("GET", "/openapi.json"),
        ("GET", "/docs"),
        ("GET", "/"),
        ("GET", "/static/js/main.js"),
    ],
)
@pytest.mark.parametrize("auth", [None, "Bearer wrong", f"Basic {TOKEN}", f"Bearer {TOKEN}x"])
def test_every_route_but_healthz_asks_for_the_token(api: TestClient, method: str, path: str, auth: str | None) -> None:
    headers = {"authorization": auth} if auth else {}
    response = api.request(method, path, headers=headers)
    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Bearer")
    detail = response.json()["detail"]
    assert detail[0]["loc"] == ["header", "authorization"] and detail[0]["type"] == "unauthorized"
    assert "content-security-policy" in response.headers  # the security headers, on a 401 too


def test_the_bearer_token_lets_the_api_in(api: TestClient) -> None:
    response = api.post("/api/v1/loss", json=ARTICLE, headers=BEARER)
    assert response.status_code == 200 and response.json()["num_positions"] == 15
    assert api.get("/openapi.json", headers=BEARER).status_code == 200


def test_a_browser_is_sent_to_the_sign_in_page_and_back(api: TestClient) -> None:
    response = api.get("/docs?x=1", headers=HTML)
    assert response.status_code == 303 and response.headers["location"] == "/signin?next=/docs%3Fx%3D1"
    page = api.get("/signin", params={"next": "/docs"})
    assert page.status_code == 200 and 'name="token"' in page.text and 'value="/docs"' in page.text


def test_signing_in_sets_an_httponly_strict_cookie_that_opens_every_route() -> None:
    api = guarded()
    wrong = api.post("/signin", data={"token": "nope", "next": "/"})
    assert wrong.status_code == 401 and "not this instance" in wrong.text and "set-cookie" not in wrong.headers
    response = api.post("/signin", data={"token": TOKEN, "next": "/docs"})
    assert response.status_code == 303 and response.headers["location"] == "/docs"
    cookie = response.headers["set-cookie"]
    name, _, value = cookie.partition(";")[0].partition("=")
    assert name == COOKIE and SESSION.fullmatch(value)  # id.expiry.signature, never the token
    assert TOKEN not in cookie
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie
    assert "Max-Age=43200" in cookie  # the browser drops it when the server would refuse it (12 h)
    assert "Secure" not in cookie  # plain http here: a Secure cookie would never come back
    assert api.get("/", headers=HTML).status_code == 200
    assert api.post("/api/v1/loss", json=ARTICLE).status_code == 200
    out = api.post("/signout")
    assert out.status_code == 303 and out.headers["location"] == "/signin"
    assert "Max-Age=0" in out.headers["set-cookie"] or "expires" in out.headers["set-cookie"].lower()
    api.cookies.clear()
    assert api.get("/", headers=HTML).status_code == 303


@pytest.mark.parametrize("target", ["//evil.example/", "https://evil.example/", "/\\evil.example", ""])
def test_after_signing_in_the_redirect_never_leaves_the_site(target: str) -> None:
    response = guarded().post("/signin", data={"token": TOKEN, "next": target})
    assert response.headers["location"] == "/"


def test_behind_a_trusted_proxy_over_https_the_cookie_is_secure() -> None:
    forwarded = {"x-forwarded-proto": "https", "x-forwarded-for": "203.0.113.7"}
    trusted = guarded(forwarded_allow_ips=["*"]).post("/signin", data={"token": TOKEN}, headers=forwarded)
    assert "Secure" in trusted.headers["set-cookie"]
    untrusted = guarded().post("/signin", data={"token": TOKEN}, headers=forwarded)  # no proxy configured
    assert "Secure" not in untrusted.headers["set-cookie"]


def test_only_the_allowed_hosts_are_served() -> None:
    api = TestClient(create_app(Settings(allowed_hosts=["lens.example.org"])), follow_redirects=False)
    assert api.get("/healthz", headers={"host": "lens.example.org"}).status_code == 200
    refused = api.get("/healthz", headers={"host": "evil.example"})
    assert refused.status_code == 400 and "content-security-policy" in refused.headers


def test_redirects_are_paths_whatever_the_host_header() -> None:
    # any Host served (the no-token default serves only the loopback names: tests/test_hostile_members.py)
    api = TestClient(create_app(Settings(allowed_hosts=["*"])), follow_redirects=False)
    response = api.get("/static", headers={"host": "evil.example"})
    assert response.status_code in (301, 307) and response.headers["location"] == "/static/"


def test_no_token_set_means_no_sign_in() -> None:
    """No token: no sign-in, the page and the API answer. Another origin's POST is refused all the same (issue
    33: without a token any web page could plant runs with a cross-site form post); a client that sends no
    Origin (curl, httpx, the CLI: never a browser's cross-site post) is served."""
    api = TestClient(create_app(Settings()), follow_redirects=False)
    assert api.get("/", headers=HTML).status_code == 200
    assert api.post("/api/v1/loss", json=ARTICLE).status_code == 200
    cross = {"origin": "http://testserver:9999", "sec-fetch-site": "same-site"}
    assert api.post("/api/v1/loss", json=ARTICLE, headers=cross).status_code == 403
    assert api.post("/signin", data={"token": "x"}).status_code == 303


@pytest.mark.parametrize(
    ("raw", "seconds"), [("43200", 43200), ("12h", 43200), ("30m", 1800), ("7d", 604800), (" 90S ", 90)]
)
def test_the_session_ttl_reads_seconds_or_a_duration(raw: str, seconds: int) -> None:
    assert Settings(session_ttl=raw).session_ttl == seconds


@pytest.mark.parametrize("raw", ["12 hours", "1.5h", "-5m", "59", "31d", "١٢h", ""])
def test_a_session_ttl_out_of_range_or_unreadable_is_refused(raw: str) -> None:
    with pytest.raises(ValueError, match="session_ttl"):
        Settings(session_ttl=raw)


def test_signing_in_again_ends_the_session_this_browser_held() -> None:
    api = guarded()
    api.post("/signin", data={"token": TOKEN})
    first = api.cookies[COOKIE]
    api.post("/signin", data={"token": TOKEN})
    assert api.cookies[COOKIE] != first
    assert api.get("/api/v1/options").status_code == 200
    other = TestClient(api.app)  # no cookie jar: the old cookie alone
    assert other.get("/api/v1/options", headers={"cookie": f"{COOKIE}={first}"}).status_code == 401
