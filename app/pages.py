"""HTML routes: the dashboard, the offline API docs, and plotly.js from the installed package."""

from __future__ import annotations

from pathlib import Path

import plotly
from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, HTMLResponse
from fastapi.templating import Jinja2Templates

ROOT = Path(__file__).resolve().parent.parent
templates = Jinja2Templates(directory=ROOT / "templates")
PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"

router = APIRouter(include_in_schema=False)


@router.get("/", response_class=HTMLResponse)
def dashboard(request: Request) -> HTMLResponse:
    return templates.TemplateResponse(request, "index.html", {})


@router.get("/docs", response_class=HTMLResponse)
def docs(request: Request) -> HTMLResponse:
    """Swagger UI from vendor/swagger-ui (no CDN), initialised by a script file (the CSP allows no inline script)."""
    return templates.TemplateResponse(request, "docs.html", {})


@router.get("/vendor/plotly.min.js")
def plotly_js() -> FileResponse:
    return FileResponse(PLOTLY_JS, media_type="text/javascript", headers={"cache-control": "public, max-age=86400"})
