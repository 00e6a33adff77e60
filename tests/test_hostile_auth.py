"""Sessions as a hostile member of the team (or a former one) would try them: a cookie kept after sign-out,
past its expiry, under an old token, forged or tampered with, and a page on another origin of the same
site (another port, a sibling subdomain) riding the SameSite=Strict cookie. In process (ASGI), each
test on its own app; requests carry a cookie header by hand on clients without a cookie jar, as an
attacker's copy would."""

from __future__ import annotations

import hashlib
import hmac
import io
import zipfile
from pathlib import Path
from typing import Any

import pytest
from api_fixtures import ARTICLE
from fastapi.testclient import TestClient
from test_api_runs import write_run

from app.auth import COOKIE, Sessions
from app.main import create_app
from app.settings import Settings

TOKEN = "team-secret-9b17"
OPTIONS = "/api/v1/options"


def app_for(token: str = TOKEN, **settings: Any) -> Any:
    return create_app(Settings(auth_token=token, **settings))


def sign_in(app: Any) -> str:
    """The cookie value a browser gets from the sign-in form."""
    response = TestClient(app, follow_redirects=False).post("/signin", data={"token": TOKEN})
    assert response.status_code == 303
    return str(response.cookies[COOKIE])


def with_cookie(app: Any, value: str, **headers: str) -> TestClient:
    """A client that sends exactly this cookie (and these headers), as a copied cookie would be sent."""
    return TestClient(app, follow_redirects=False, headers={"cookie": f"{COOKIE}={value}", **headers})


def refused(response: Any, status: int, loc: list[str]) -> None:
    assert response.status_code == status, response.text
    assert response.json()["detail"][0]["loc"] == loc
    assert "content-security-policy" in response.headers


# --- sessions that end -------------------------------------------------------------------------------


def test_a_cookie_copied_before_sign_out_is_refused_after_it() -> None:
    app = app_for()
    value = sign_in(app)
    copy = with_cookie(app, value)
    assert copy.get(OPTIONS).status_code == 200
    browser = with_cookie(app, value)
    assert browser.post("/signout").status_code == 303
    refused(copy.get(OPTIONS), 401, ["header", "authorization"])
    refused(copy.post("/api/v1/loss", json=ARTICLE), 401, ["header", "authorization"])
    assert app.state.sessions.table == {}


def test_an_expired_cookie_is_refused_and_its_entry_dropped() -> None:
    app = app_for(session_ttl="2h")
    now = [1_800_000_000.0]
    app.state.sessions.clock = lambda: now[0]
    value = sign_in(app)
    client = with_cookie(app, value)
    now[0] += 7200 - 1  # one second before the end: still in
    assert client.get(OPTIONS).status_code == 200
    now[0] += 1  # its expiry: out, and the table forgets it
    refused(client.get(OPTIONS), 401, ["header", "authorization"])
    assert app.state.sessions.table == {}


def test_a_cookie_of_the_old_token_is_refused_after_the_token_changes() -> None:
    old = app_for()
    value = sign_in(old)
    new = app_for("rotated-token-51c0")
    refused(with_cookie(new, value).get(OPTIONS), 401, ["header", "authorization"])
    # Even with its id and expiry in the new server's table, the signature is of the old token's key.
    sid, expires, _ = value.split(".")
    new.state.sessions.table[sid] = int(expires)
    refused(with_cookie(new, value).get(OPTIONS), 401, ["header", "authorization"])


def test_a_restart_signs_everyone_out() -> None:
    """The table lives in the server process: a new process (same token) knows none of the old sessions."""
    value = sign_in(app_for())
    refused(with_cookie(app_for(), value).get(OPTIONS), 401, ["header", "authorization"])


def _resigned(value: str, **change: str) -> str:
    sid, expires, signature = value.split(".")
    return ".".join([change.get("sid", sid), change.get("expires", expires), change.get("signature", signature)])


TAMPERED = {
    "expiry pushed a year on": lambda v: _resigned(v, expires=str(int(v.split(".")[1]) + 365 * 86400)),
    "another id": lambda v: _resigned(v, sid="A" * 24),
    "one bit of the signature": lambda v: v[:-1] + ("0" if v[-1] != "0" else "1"),
    "signature upper-cased": lambda v: v.upper(),
    "the pre-session cookie (an HMAC of the token)": lambda v: hmac.new(
        TOKEN.encode(), b"grpo-lens sign-in", hashlib.sha256
    ).hexdigest(),
    "signed with the token itself": lambda v: _resigned(
        v, signature=hmac.new(TOKEN.encode(), v.rsplit(".", 1)[0].encode(), hashlib.sha256).hexdigest()
    ),
    "Arabic-Indic digits": lambda v: _resigned(v, expires="\u0661" * 10),
    "empty": lambda v: "",
    "dots only": lambda v: "..",
    "extra part": lambda v: v + ".00",
    "10 kB": lambda v: "a" * 10_000,
}


@pytest.mark.parametrize("change", TAMPERED.values(), ids=TAMPERED.keys())
def test_a_forged_or_tampered_cookie_is_refused(change: Any) -> None:
    app = app_for()
    value = sign_in(app)
    forged = change(value)
    client = TestClient(app, follow_redirects=False, headers={"cookie": f"{COOKIE}={forged}".encode()})
    refused(client.get(OPTIONS), 401, ["header", "authorization"])
    assert client.post("/signout").status_code == 303  # nothing ended: the real session still stands
    assert with_cookie(app, value).get(OPTIONS).status_code == 200


def test_a_forged_cookie_beside_a_real_one_does_not_hide_it() -> None:
    """A sibling subdomain can add a cookie of the same name; the real session still counts."""
    app = app_for()
    value = sign_in(app)
    client = TestClient(app, headers={"cookie": f"{COOKIE}=junk; {COOKIE}={value}"})
    assert client.get(OPTIONS).status_code == 200


def test_the_session_table_is_bounded_and_drops_expired_entries() -> None:
    now = [1_000_000.0]
    sessions = Sessions(TOKEN, ttl=100, limit=3, clock=lambda: now[0])
    values = [sessions.start() for _ in range(5)]
    assert len(sessions.table) == 3
    assert [sessions.check(v) is not None for v in values] == [False, False, True, True, True]  # the oldest ended
    now[0] += 100
    fresh = sessions.start()  # every other entry had expired: dropped before this one went in
    assert list(sessions.table) == [fresh.split(".")[0]]


# --- requests from another origin of the same site ------------------------------------------------------

OTHER_ORIGINS = {
    "another port": {"origin": "http://testserver:9999", "sec-fetch-site": "same-site"},
    "a sibling subdomain": {"origin": "http://evil.testserver", "sec-fetch-site": "same-site"},
    "https page, http server": {"origin": "https://testserver"},
    "an opaque origin": {"origin": "null"},
    "Origin alone, another port": {"origin": "http://testserver:8001"},
    "Sec-Fetch-Site alone": {"sec-fetch-site": "same-site"},
    "a garbage Origin": {"origin": "http://[::1"},
}


@pytest.mark.parametrize("headers", OTHER_ORIGINS.values(), ids=OTHER_ORIGINS.keys())
@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/api/v1/loss", ARTICLE),
        ("POST", "/api/v1/export/json", ARTICLE),
        ("POST", "/api/v1/lab/runs", {"steps": 2}),
        ("DELETE", "/api/v1/runs/some-run", None),
        ("DELETE", "/api/v1/lab/runs/some-run", None),
    ],
)
def test_a_cookie_request_from_another_origin_is_refused(
    method: str, path: str, body: Any, headers: dict[str, str], tmp_path: Path
) -> None:
    app = app_for(runs_dir=str(tmp_path))
    response = with_cookie(app, sign_in(app), **headers).request(method, path, json=body)
    refused(response, 403, ["header", "origin"])
    assert response.json()["detail"][0]["type"] == "cross_origin"
    assert list(tmp_path.iterdir()) == []  # no lab run was started


def test_another_origin_cannot_upload_or_delete_a_run(tmp_path: Path) -> None:
    source = write_run(tmp_path / "src", "kept")
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as z:
        for path in sorted(source.rglob("*")):
            z.write(path, path.relative_to(source).as_posix())
    runs = tmp_path / "runs"
    write_run(runs, "victim")
    app = app_for(runs_dir=str(runs))
    with with_cookie(app, sign_in(app), origin="http://testserver:9999") as evil:
        upload = evil.post("/api/v1/runs", files={"file": ("planted.zip", archive.getvalue())})
        refused(upload, 403, ["header", "origin"])
        refused(evil.delete("/api/v1/runs/victim"), 403, ["header", "origin"])
    assert sorted(p.name for p in runs.iterdir()) == ["victim"]


def test_same_origin_requests_pass() -> None:
    app = app_for()
    value = sign_in(app)
    own = [
        {"origin": "http://testserver", "sec-fetch-site": "same-origin"},  # what Chromium sends
        {"origin": "http://testserver"},  # a browser without Fetch Metadata
        {"origin": "HTTP://TestServer:80"},  # the default port spelled out; case differs
        {"sec-fetch-site": "same-origin", "origin": "https://lens.example.org"},  # a proxy rewrote Host
        {},  # curl with a cookie: no browser, no other origin to fear
    ]
    for headers in own:
        assert with_cookie(app, value, **headers).post("/api/v1/loss", json=ARTICLE).status_code == 200, headers


def test_behind_a_trusted_proxy_the_origin_is_the_forwarded_scheme() -> None:
    https = {"x-forwarded-proto": "https", "origin": "https://testserver"}
    trusted = app_for(forwarded_allow_ips=["*"])
    assert with_cookie(trusted, sign_in(trusted), **https).post("/api/v1/loss", json=ARTICLE).status_code == 200
    untrusted = app_for()  # no proxy configured: the header is a client's claim, the request is plain http
    response = with_cookie(untrusted, sign_in(untrusted), **https).post("/api/v1/loss", json=ARTICLE)
    refused(response, 403, ["header", "origin"])


def test_bearer_requests_need_no_origin() -> None:
    bearer = TestClient(app_for(), headers={"authorization": f"Bearer {TOKEN}"})
    assert bearer.post("/api/v1/loss", json=ARTICLE).status_code == 200
    # no page on another origin can make a browser send this header (it would need CORS, which is off)
    assert bearer.post("/api/v1/loss", json=ARTICLE, headers={"origin": "http://elsewhere:1"}).status_code == 200


def test_reading_with_the_cookie_from_another_origin_is_not_refused() -> None:
    """GET and HEAD change nothing (and SameSite keeps other sites out); another origin cannot read the answer."""
    app = app_for()
    client = with_cookie(app, sign_in(app), **OTHER_ORIGINS["another port"])
    assert client.get(OPTIONS).status_code == 200
    assert client.head(OPTIONS).status_code == 200


def test_the_sign_in_and_out_forms_refuse_another_origin() -> None:
    """Login CSRF: another origin cannot sign a browser in (to a session it chose) or out."""
    app = app_for()
    evil = TestClient(app, follow_redirects=False, headers=OTHER_ORIGINS["another port"])
    signin = evil.post("/signin", data={"token": TOKEN})
    refused(signin, 403, ["header", "origin"])
    assert "set-cookie" not in signin.headers and app.state.sessions.table == {}
    value = sign_in(app)
    refused(with_cookie(app, value, **OTHER_ORIGINS["another port"]).post("/signout"), 403, ["header", "origin"])
    assert with_cookie(app, value).get(OPTIONS).status_code == 200  # still signed in
    own = TestClient(app, follow_redirects=False, headers={"origin": "http://testserver"})
    assert own.post("/signin", data={"token": TOKEN}).status_code == 303
