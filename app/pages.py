"""HTML routes: the dashboard, the offline API docs, plotly.js from the installed package, sign-in and sign-out."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import plotly
from fastapi import APIRouter, Form, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from app.auth import COOKIE, cookie_values, safe_next, token_matches
from app.boot import boot_json
from app.deps import LanesDep, SessionsDep, SettingsDep

ROOT = Path(__file__).resolve().parent.parent
templates = Jinja2Templates(directory=ROOT / "templates")
PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"

router = APIRouter(include_in_schema=False)


@router.get("/", response_class=HTMLResponse)
async def dashboard(request: Request, lanes: LanesDep, settings: SettingsDep) -> HTMLResponse:
    """The dashboard, carrying its options and the first answer (``app.boot``): its first view needs no request."""
    boot = await boot_json(dict(request.query_params), lanes, settings)
    return templates.TemplateResponse(request, "index.html", {"boot": boot})


@router.get("/docs", response_class=HTMLResponse)
def docs(request: Request) -> HTMLResponse:
    """Swagger UI from vendor/swagger-ui (no CDN), initialised by a script file (the CSP allows no inline script)."""
    return templates.TemplateResponse(request, "docs.html", {})


@router.get("/vendor/plotly.min.js")
def plotly_js() -> FileResponse:
    return FileResponse(PLOTLY_JS, media_type="text/javascript", headers={"cache-control": "public, max-age=86400"})


@router.get("/signin", response_class=HTMLResponse)
def signin_page(request: Request, next: str = "/") -> HTMLResponse:
    return templates.TemplateResponse(request, "signin.html", {"next": safe_next(next), "error": None})


@router.post("/signin", response_model=None)
def signin(
    request: Request,
    settings: SettingsDep,
    sessions: SessionsDep,
    token: Annotated[str, Form()] = "",
    next: Annotated[str, Form()] = "/",
) -> Response:
    """The team's token -> a new session cookie (HttpOnly, SameSite=Strict, Secure over HTTPS, ending after
    ``session_ttl``), then where you were. A session this browser held before ends."""
    expected = settings.auth_token
    if expected is None or sessions is None:
        return RedirectResponse(safe_next(next), status_code=303)
    if not token_matches(token, expected):
        context = {"next": safe_next(next), "error": "That token is not this instance's."}
        return templates.TemplateResponse(request, "signin.html", context, status_code=401)
    for value in cookie_values(request.headers.get("cookie", "")):
        sessions.end(value)
    response = RedirectResponse(safe_next(next), status_code=303)
    secure = request.url.scheme == "https"
    cookie = sessions.start()
    response.set_cookie(COOKIE, cookie, max_age=sessions.ttl, httponly=True, samesite="strict", secure=secure, path="/")
    return response


@router.post("/signout", response_model=None)
def signout(request: Request, sessions: SessionsDep) -> Response:
    """Ends the session server-side (a copy of the cookie is refused from now on) and clears the cookie."""
    if sessions is not None:
        for value in cookie_values(request.headers.get("cookie", "")):
            sessions.end(value)
    response = RedirectResponse("/signin", status_code=303)
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict", secure=request.url.scheme == "https")
    return response
