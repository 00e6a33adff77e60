"""All server settings in one place, read from GRPO_LENS_* environment variables."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """GRPO Lens server settings; each one overridable as GRPO_LENS_<NAME>."""

    model_config = SettingsConfigDict(env_prefix="GRPO_LENS_")

    max_body_bytes: int = Field(64 * 1024 * 1024, ge=1024, description="Largest request body (413 beyond).")
    max_upload_bytes: int = Field(64 * 1024 * 1024, ge=1024, description="Largest uploaded file (413 beyond).")
    max_tokens: int = Field(4_194_304, ge=1, description="Most token positions in one request (413 beyond).")
    full_token_limit: int = Field(
        65_536, ge=0, description="Per-token arrays are returned for batches up to this many positions."
    )
    max_compare_configs: int = Field(8, ge=1, description="Most configs in one /api/v1/compare request.")
    cors_origins: list[str] = Field(default_factory=list, description="Origins allowed by CORS (none by default).")
    max_unpacked_bytes: int = Field(
        256 * 1024 * 1024, ge=1024, description="Largest size a zipped upload (NPZ, .pt) may unpack to (422 beyond)."
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="Device when a request does not name one; auto: a GPU when there is one, else the CPU."
    )
    threads: int = Field(4, ge=1, description="Worker threads for the loss computations.")
    torch_threads: int = Field(0, ge=0, description="torch intra-op threads per computation (0: torch's default).")
    runs_dir: Path = Field(Path("runs"), description="Where runs live (captured and lab), one directory each.")
    lab_max_concurrent: int = Field(
        2, ge=1, description="Lab runs training at once (one worker process each); the rest queue."
    )
    lab_max_queue: int = Field(32, ge=0, description="Lab runs waiting at most (429 beyond).")
    lab_max_steps: int = Field(1000, ge=1, description="Most optimiser steps one lab run may ask for (422 beyond).")
    lab_max_seconds: float = Field(300.0, gt=0, description="A lab run stops after this many seconds of training.")
    lab_torch_threads: int = Field(1, ge=1, description="torch threads per lab worker process.")
    lab_nice: int = Field(10, ge=0, le=19, description="os.nice increment of lab worker processes (lower priority).")


@lru_cache
def get_settings() -> Settings:
    return Settings()
