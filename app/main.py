"""Builds the GRPO Lens app: routers, static files, middleware, error handlers. `uvicorn app.main:app`."""

from __future__ import annotations

import gc
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import torch
from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.openapi.utils import get_openapi
from fastapi.staticfiles import StaticFiles
from starlette.middleware.trustedhost import TrustedHostMiddleware
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from app import api, export, handlers, lab, pages, runs
from app.auth import RequireToken, SameOriginWrites, Sessions, SignInRate
from app.lanes import Lanes, Spooled
from app.middleware import BodyLimit, HeadAsGet, KeepTransport, LocalHosts, SecurityHeaders, TrimWhenGrown
from app.settings import Settings, get_settings
from app.store import RunStore
from app.watch import Watcher
from grpo._allocator import keep_freed_memory

ROUTERS = [api.router, export.router, runs.router, lab.router, pages.router]  # a new router: one line here


def create_app(settings: Settings | None = None) -> FastAPI:
    """The app for ``settings`` (default: the environment's): its lanes (threads, and worker processes
    started with it), routes and guards."""
    settings = settings or get_settings()
    app = FastAPI(
        title="GRPO Lens",
        version="0.1.0",
        summary="The GRPO loss of your own batch, computed as TRL, verl or the article would, and explained.",
        docs_url=None,
        redoc_url=None,
        lifespan=_lifespan(settings),
    )
    _add_state(app, settings)
    handlers.install(app)
    _add_routes(app)
    _add_middleware(app, settings)
    return app


def _lifespan(settings: Settings) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """What starts with the server and stops with it: the lanes, the run store's sweep and the watcher."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        logging.getLogger("grpo_lens").setLevel(logging.INFO)
        if settings.torch_threads:
            torch.set_num_threads(settings.torch_threads)
        keep_freed_memory()  # large jobs in threads reuse their buffers; the lanes trim the heap once idle
        app.state.lanes.start()
        app.state.store.sweep()  # what a crash left half-written or half-deleted
        # The ~200,000 objects of the imports live as long as the process: out of the collector's sight,
        # a full collection does not walk them all (each walk is a pause of 100-200 ms holding the GIL, which
        # every request would wait on: the small requests' p99).
        gc.collect()
        gc.freeze()
        app.state.watcher.start()
        try:
            yield
        finally:
            app.state.watcher.stop()
            app.state.lanes.stop()

    return lifespan


def _add_state(app: FastAPI, settings: Settings) -> None:
    """What the routes share: the settings, the lanes, the sign-in sessions, the run store and its watcher."""
    app.state.settings = settings
    app.state.lanes = Lanes(settings)
    token = settings.auth_token
    app.state.sessions = Sessions(token, settings.session_ttl, settings.max_sessions) if token else None
    app.state.store = RunStore(settings)
    app.state.watcher = Watcher(settings)  # running runs' new steps, pushed to their event streams


def _add_routes(app: FastAPI) -> None:
    """The routers, the static files and the OpenAPI document."""
    for router in ROUTERS:
        app.include_router(router)
    app.mount("/static", StaticFiles(directory=pages.ROOT / "static"), name="static")
    app.mount("/vendor/swagger-ui", StaticFiles(directory=pages.ROOT / "vendor" / "swagger-ui"), name="swagger-ui")
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]


def _add_middleware(app: FastAPI, settings: Settings) -> None:
    """Middleware, innermost first: the last added sees the request first."""
    app.add_middleware(HeadAsGet)
    app.add_middleware(TrimWhenGrown, idle=settings.trim_idle)  # memory back after any route that grew the process
    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=settings.cors_origins, allow_methods=["GET", "POST"])
    app.add_middleware(
        BodyLimit,
        limit=lambda path: (
            settings.max_upload_bytes + 65536 if path in ("/api/v1/upload", "/api/v1/runs") else settings.max_body_bytes
        ),
        timeout=settings.request_timeout,
        spool_bytes=max(settings.large_request_bytes, Spooled.HEAD_BYTES),  # large bodies into a file as they come
        before_large_chunk=app.state.lanes.small_first.before_large_chunk,
    )
    _add_guards(app, settings)
    app.add_middleware(SecurityHeaders)
    if settings.forwarded_allow_ips:  # X-Forwarded-Proto/-For only from these proxies (https -> Secure cookie)
        app.add_middleware(ProxyHeadersMiddleware, trusted_hosts=settings.forwarded_allow_ips)
    stack = app.build_middleware_stack  # outside Starlette's error middleware too, where send is the server's own
    app.build_middleware_stack = lambda: KeepTransport(stack())  # type: ignore[method-assign]


def _add_guards(app: FastAPI, settings: Settings) -> None:
    """Who may call: the token (or same-origin writes without one), and the host names the app answers to."""
    token = settings.auth_token
    if token:
        signins = SignInRate(settings.signin_per_minute)
        app.add_middleware(RequireToken, token=token, sessions=app.state.sessions, signins=signins)
    else:  # no session to ride, but a cross-site form could still change runs: same-origin writes only
        app.add_middleware(SameOriginWrites, cors_origins=settings.cors_origins)
    if settings.allowed_hosts and settings.allowed_hosts != ["*"]:
        app.add_middleware(TrustedHostMiddleware, allowed_hosts=settings.allowed_hosts, www_redirect=False)
    elif not settings.allowed_hosts and not token:  # DNS rebinding: only names no other site can take over
        app.add_middleware(LocalHosts)


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document plus the request models of the routes that read their own bodies."""
    if not app.openapi_schema:
        schema = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
        schema.setdefault("components", {}).setdefault("schemas", {}).update(api.body_schemas())
        app.openapi_schema = schema
    return app.openapi_schema


app = create_app(get_settings())
