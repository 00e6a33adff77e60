"""How errors are answered: the exception handlers, the HTML error page, the methods a 405 names.

The error *shape* is ``app.errors``'s (every module builds its errors there); this module answers them,
with the page templates and the security headers it needs, so ``app.errors`` imports no other app module.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match, Mount

import grpo
from app.errors import BODY_EXPECTED, ApiError, as_api_error, error_item, error_response, invalid
from app.middleware import SECURITY_HEADERS
from app.pages import templates

ERROR_TEXT = {
    401: "Sign in first.",
    404: "There is no page here.",
    405: "This address does not take that kind of request.",
}


def wants_html(request: Request) -> bool:
    return not request.url.path.startswith(("/api/", "/healthz", "/openapi")) and "text/html" in request.headers.get(
        "accept", ""
    )


def error_page(request: Request, status: int) -> Response:
    message = ERROR_TEXT.get(status, "Something went wrong with this request.")
    return templates.TemplateResponse(request, "error.html", {"status": status, "message": message}, status_code=status)


def install(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def validation(_: Request, exc: RequestValidationError) -> Response:
        return error_response(invalid(list(exc.errors())))

    @app.exception_handler(grpo.GrpoInputError)
    async def library(request: Request, exc: grpo.GrpoInputError) -> Response:
        return error_response(as_api_error(exc, request.url.path))

    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> Response:
        return error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def http(request: Request, exc: StarletteHTTPException) -> Response:
        if wants_html(request):  # a person at a browser: the one error page, not JSON
            return error_page(request, exc.status_code)
        if exc.status_code == 400 and isinstance(exc.detail, str):  # FastAPI could not decode the body
            return error_response(
                ApiError(422, [error_item(["body"], f"{exc.detail}: {BODY_EXPECTED}", "body_invalid")])
            )
        body = exc.detail if isinstance(exc.detail, list) else [error_item([], str(exc.detail), "http_error")]
        headers = dict(getattr(exc, "headers", None) or {})
        if exc.status_code == 405:  # Starlette names only the first matching route's methods
            allowed = allowed_methods(request)
            headers["Allow"] = ", ".join(allowed)
            msg = f"{request.method} is not taken at this address; expected one of {', '.join(allowed)}"
            body = [error_item(["method"], msg, "method_not_allowed")]
        return error_response(ApiError(exc.status_code, body, headers))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> Response:
        # Starlette answers this from its outermost middleware, outside SecurityHeaders: add them here.
        response = error_response(as_api_error(exc, f"{request.method} {request.url.path}"))
        for name, value in SECURITY_HEADERS:
            response.headers[name.decode()] = value.decode()
        return response


METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")


def allowed_methods(request: Request) -> list[str]:
    """Every method a route at this path takes (several routes share a path, one per method), the
    pages' too; HEAD wherever GET is (``app.middleware.HeadAsGet``)."""
    scope = {**request.scope, "root_path": request.scope.get("app_root_path", "")}  # a mount changes root_path
    methods: set[str] = set()
    for route in request.app.routes:
        if isinstance(route, Mount):  # the static files: GET and HEAD
            methods |= {"GET", "HEAD"} if route.matches(scope)[0] == Match.FULL else set()
            continue
        methods |= {m for m in METHODS if route.matches({**scope, "method": m})[0] == Match.FULL}
    if "GET" in methods and not request.url.path.endswith("/events"):
        methods.add("HEAD")
    return sorted(methods)
