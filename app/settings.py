"""All server settings in one place, read from GRPO_LENS_* environment variables."""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import fields
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from grpo.runs import AnomalyThresholds

DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# the library's defaults, written once there (every field of the frozen dataclass has one)
THRESHOLD: dict[str, Any] = {f.name: f.default for f in fields(AnomalyThresholds)}


def _cache_dir() -> Path:
    """This user's directory under the system temp dir (the server makes it private: mode 0700)."""
    uid = os.geteuid() if hasattr(os, "geteuid") else "user"
    return Path(tempfile.gettempdir()) / f"grpo-lens-cache-{uid}"


class Settings(BaseSettings):
    """GRPO Lens server settings; each one overridable as GRPO_LENS_<NAME>."""

    model_config = SettingsConfigDict(env_prefix="GRPO_LENS_")

    max_body_bytes: int = Field(64 * 1024 * 1024, ge=1024, description="Largest request body (413 beyond).")
    max_upload_bytes: int = Field(64 * 1024 * 1024, ge=1024, description="Largest uploaded file (413 beyond).")
    max_tokens: int = Field(
        4_194_304,
        ge=1,
        description="Most padded positions in one request: rows x the longest row (x configs for compare); 413 beyond.",
    )
    max_request_bytes: int = Field(
        1536 * 1024 * 1024,
        ge=1024 * 1024,
        description="Most memory one request may take to compute, as estimated before allocating (413 beyond).",
    )
    full_token_limit: int = Field(
        65_536, ge=0, description="Per-token arrays are returned for batches up to this many positions."
    )
    max_compare_configs: int = Field(8, ge=1, description="Most configs in one /api/v1/compare request.")
    cors_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Origins allowed by CORS (none by default)."
    )
    max_unpacked_bytes: int = Field(
        256 * 1024 * 1024,
        ge=1024,
        description="Most bytes an upload's fields may unpack to (priced from its headers), or an export's file (413).",
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="Device when a request does not name one; auto: a GPU when there is one, else the CPU."
    )
    threads: int = Field(4, ge=1, description="Threads for small requests (parse, check, compute), in the server.")
    large_request_bytes: int = Field(
        1024 * 1024,
        ge=0,
        description="Bodies of this size and larger go to a worker process where they must be parsed (JSON, text, "
        ".pt), to the large lane's threads where they are binary files or run zips; smaller ones start in the small "
        "requests' threads (each then priced: see cheap_request_bytes).",
    )
    cheap_request_bytes: int = Field(
        256 * 1024 * 1024,
        ge=0,
        description="Work priced past this (its padded positions' working memory, an export's file, a run zip's "
        "steps) runs in the costly lane (a worker process), whatever its body's size.",
    )
    cheap_unpack_bytes: int = Field(
        32 * 1024 * 1024,
        ge=0,
        description="A binary upload whose read fields are priced past this once unpacked (from its headers) is "
        "unpacked in the costly lane (a worker process), whatever its body's size.",
    )
    process_workers: int = Field(
        1, ge=0, description="Worker processes for large requests (0: large requests run in threads too)."
    )
    process_queue: int = Field(2, ge=0, description="Large requests that may wait for a worker (503 beyond).")
    process_queue_per_client: int = Field(
        2,
        ge=1,
        description="Large requests one client (a signed-in session, else an address) may have running or waiting "
        "for a worker, and always one fewer than process_workers + process_queue (429 beyond): no one fills the lane.",
    )
    retry_after: int = Field(5, ge=1, description="Seconds a 503 for a full large-request lane asks to wait.")
    worker_nice: int = Field(
        10, ge=0, le=19, description="How much lower the workers' CPU priority is than the server's: small first."
    )
    worker_recycle_bytes: int = Field(
        256 * 1024 * 1024, ge=0, description="Idle workers holding this much more than at start are replaced."
    )
    worker_recycle_idle: float = Field(
        3.0, ge=0, description="Seconds the large-request lane must be idle before grown workers are replaced."
    )
    worker_torch_threads: int = Field(1, ge=0, description="torch threads per worker process (0: torch's default).")
    worker_huge_pages: bool = Field(
        False,
        description="Worker processes allocate in transparent huge pages (glibc.malloc.hugetlb=1, where the "
        "kernel allows them: a large request's buffers, faulted in again after each trim, take 512x fewer faults); "
        "a job under 16 MiB of request bytes, or priced past 512 MiB of working memory, runs with them off. Off by "
        "default: on a VM whose host takes back the guest's free memory the largest requests ran 3x slower.",
    )
    small_first_wait: float = Field(
        0.01,
        ge=0,
        le=1,
        description="Small requests first: while one is computed, a large body's next chunk waits and a worker "
        "pauses before its next torch operation, each at most this many seconds at a time (0: neither waits).",
    )
    trim_idle: float = Field(
        2.0,
        ge=0,
        description="Seconds without large work before a process gives its freed memory back to the OS (a large "
        "request within them reuses the pages already mapped; below worker_recycle_idle, so that a worker is "
        "judged grown on its trimmed heap).",
    )
    auth_token: str | None = Field(
        None, description="Shared secret: when set, every route but /healthz asks for it (bearer or sign-in cookie)."
    )
    session_ttl: int = Field(
        12 * 3600,
        ge=60,
        le=30 * 86400,
        description="How long a sign-in lasts: seconds, or a duration such as 12h, 30m, 7d (1 minute to 30 days).",
    )
    max_sessions: int = Field(
        10_000,
        ge=1,
        description="Sign-ins one server process remembers at once; past it, the least recently used is signed out.",
    )
    signin_per_minute: int = Field(
        30, ge=1, description="Sign-in attempts one client address may make per minute (429 with Retry-After beyond)."
    )

    @field_validator("session_ttl", mode="before")
    @classmethod
    def _duration(cls, value: object) -> object:
        """``12h``, ``30m``, ``90s``, ``7d`` or plain seconds (ASCII digits only)."""
        if isinstance(value, str):
            match = re.fullmatch(r"\s*([0-9]{1,9})\s*([smhd]?)\s*", value.lower())
            if match:
                return int(match[1]) * DURATION_UNITS[match[2] or "s"]
        return value

    allowed_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description=(
            "Host headers served (comma-separated; * for any). Unset: any with a token; without one, the "
            "loopback names and the server's own address (a page on another site cannot rebind those)."
        ),
    )
    forwarded_allow_ips: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Proxies whose X-Forwarded-Proto/-For are trusted (comma-separated IPs; none by default).",
    )
    request_timeout: float = Field(
        30.0, gt=0, description="Seconds a client has to send a request's headers, and its body (dropped after)."
    )
    torch_threads: int = Field(0, ge=0, description="torch intra-op threads per computation (0: torch's default).")
    runs_dir: Path = Field(Path("runs"), description="Where runs live (captured and lab), one directory each.")
    cache_dir: Path = Field(
        default_factory=_cache_dir,
        description="Where a read-only run's timeline is kept (default: grpo-lens-cache-<uid> under the temp dir).",
    )
    timeline_spike_z: float = Field(
        THRESHOLD["spike_z"], ge=0, description="Timeline: a loss this many standard deviations above its rolling mean."
    )
    timeline_clip_jump: float = Field(
        THRESHOLD["clip_jump"], ge=0, description="Timeline: a clip fraction this far (absolute) from its rolling mean."
    )
    timeline_mismatch_growth: float = Field(
        THRESHOLD["mismatch_growth"],
        ge=0,
        description="Timeline: the sampler mismatch this many times its mean over the first `window` steps.",
    )
    timeline_entropy_drop: float = Field(
        THRESHOLD["entropy_drop"], ge=0, description="Timeline: entropy below this fraction of its rolling mean."
    )
    timeline_kl_z: float = Field(
        THRESHOLD["kl_z"], ge=0, description="Timeline: a KL this many standard deviations above its rolling mean."
    )
    timeline_few_tokens_share: float = Field(
        THRESHOLD["few_tokens_share"], ge=0, description="Timeline: the share of a step's |loss| its few tokens hold."
    )
    timeline_few_tokens: int = Field(
        THRESHOLD["few_tokens"], ge=1, description="Timeline: how many tokens 'a handful' is (the few-tokens anomaly)."
    )
    timeline_window: int = Field(
        THRESHOLD["window"], ge=1, description="Timeline: steps in a rolling baseline (and the mismatch's first steps)."
    )
    replay_max_micro_batches: int = Field(
        1000, ge=1, description="Most micro-batches one run replay evaluates (whole steps; the answer's next pages on)."
    )
    runs_max_bytes: int = Field(
        20 * 1024**3,
        ge=0,
        description="Most bytes the runs directory may hold, lab runs counted (507 for an upload past it; 0: none).",
    )
    runs_min_free_bytes: int = Field(
        1024**3, ge=0, description="Free disk space an upload must leave on the runs directory's disk (507; 0: none)."
    )
    max_run_json_bytes: int = Field(
        1024 * 1024, ge=1024, description="Largest run.json an uploaded run may hold (413 beyond)."
    )
    lab_max_concurrent: int = Field(
        2, ge=1, description="Lab runs training at once (one worker process each); the rest queue."
    )
    lab_max_queue: int = Field(32, ge=0, description="Lab runs waiting at most (429 beyond).")
    lab_max_queue_per_client: int = Field(
        8,
        ge=1,
        description="Lab runs one client (a session, else an address) may have waiting at once (429 beyond).",
    )
    lab_max_steps: int = Field(1000, ge=1, description="Most optimiser steps one lab run may ask for (422 beyond).")
    lab_max_seconds: float = Field(300.0, gt=0, description="A lab run stops after this many seconds of training.")
    lab_torch_threads: int = Field(1, ge=1, description="torch threads per lab worker process.")
    lab_nice: int = Field(10, ge=0, le=19, description="os.nice increment of lab worker processes (lower priority).")
    lab_max_streams_per_run: int = Field(
        64, ge=1, description="Event streams open at once on one lab run (429 beyond)."
    )
    lab_max_streams_per_client: int = Field(
        16, ge=1, description="Event streams one client (a session, else an address) may hold open (429 beyond)."
    )
    lab_stream_stall_seconds: float = Field(
        30.0, gt=0, description="An event stream whose reader takes nothing for this long is closed."
    )
    lab_stream_history: int = Field(
        1024,
        ge=1,
        description="Most past events a new event stream replays (a reconnect with Last-Event-ID: only later ones).",
    )
    watch_interval: float = Field(
        0.5,
        gt=0,
        le=1.0,
        description="Seconds between looks at a running run's files while its events are streamed (at most 1).",
    )

    @field_validator("allowed_hosts", "forwarded_allow_ips", "cors_origins", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        """``a,b`` in the environment; a JSON list works too."""
        if isinstance(value, str) and not value.strip().startswith("["):
            return [part.strip() for part in value.split(",") if part.strip()]
        if isinstance(value, str):
            import json

            return json.loads(value)
        return value


@lru_cache
def get_settings() -> Settings:
    return Settings()
