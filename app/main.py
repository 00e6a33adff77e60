"""Builds the GRPO Lens app: routers, static files, middleware, error handlers. `uvicorn app.main:app`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import torch
from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.staticfiles import StaticFiles

from app import api, errors, export, pages
from app.middleware import BodyLimit, SecurityHeaders
from app.settings import get_settings

settings = get_settings()


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    app.state.limiter = anyio.CapacityLimiter(settings.threads)
    if settings.torch_threads:
        torch.set_num_threads(settings.torch_threads)
    yield


app = FastAPI(
    title="GRPO Lens",
    version="0.1.0",
    summary="The GRPO loss of your own batch, computed as TRL, verl or the article would, and explained.",
    docs_url=None,
    redoc_url=None,
    lifespan=lifespan,
)
app.state.limiter = anyio.CapacityLimiter(settings.threads)
errors.install(app)
app.include_router(api.router)
app.include_router(export.router)
app.include_router(pages.router)
app.mount("/static", StaticFiles(directory=pages.ROOT / "static"), name="static")
app.mount("/vendor/swagger-ui", StaticFiles(directory=pages.ROOT / "vendor" / "swagger-ui"), name="swagger-ui")
if settings.cors_origins:
    app.add_middleware(CORSMiddleware, allow_origins=settings.cors_origins, allow_methods=["GET", "POST"])
app.add_middleware(
    BodyLimit,
    limit=lambda path: settings.max_upload_bytes + 65536 if path == "/api/v1/upload" else settings.max_body_bytes,
)
app.add_middleware(SecurityHeaders)
