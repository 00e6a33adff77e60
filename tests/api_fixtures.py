"""Helpers for the API tests (imported explicitly; the library's fixtures live in conftest.py).

- ``ragged_body``: a random ragged ``/api/v1/loss`` body with every optional field set;
- ``library``: the same body evaluated by grpo directly, and ``assert_same_numbers``, which holds
  the API's JSON to the library's tensors bit for bit (float32 values survive JSON exactly:
  orjson writes the shortest decimal that reads back as the same float32);
- ``error_detail``: the one error shape, checked in one place;
- ``serve``: a real uvicorn on a free loopback port, for the socket-level tests.
"""

from __future__ import annotations

import math
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import torch
from fastapi.testclient import TestClient

import grpo
from app.main import app
from grpo.answer import ROW_FIELDS, TOKEN_FIELDS
from grpo.examples import ARTICLE_EXAMPLE
from grpo.requests import batch_from_request

ROOT = Path(__file__).resolve().parent.parent
ARTICLE: dict[str, Any] = {k: v for k, v in ARTICLE_EXAMPLE.items() if k != "tokens"}
# Named by their own trainers: verl's and the article's spellings of the same batch.
VERL_NAMES = {
    "per_token_logps": "log_prob",
    "old_per_token_logps": "old_log_prob",
    "ref_per_token_logps": "ref_log_prob",
    "completion_mask": "response_mask",
}
ARTICLE_NAMES = {
    "per_token_logps": "pi_logprob",
    "old_per_token_logps": "pi_old_logprob",
    "ref_per_token_logps": "pi_ref_logprob",
    "prompt_lengths": "input_len",
}


def client(raise_server_exceptions: bool = True) -> TestClient:
    """The ASGI client (no socket): the app runs in this process."""
    return TestClient(app, raise_server_exceptions=raise_server_exceptions)


def ragged_body(seed: int = 0, rows: int = 6, width: int = 9, group_size: int = 3) -> dict[str, Any]:
    """Ragged rows (lengths 1..width), a 0/1 mask with holes, per-row prompt lengths, rewards."""
    g = np.random.default_rng(seed)
    lengths = g.integers(1, width + 1, rows)
    old = [(-g.random(n) * 3 - 0.05).round(4) for n in lengths]
    logp = [np.minimum(o + 0.5 * g.standard_normal(len(o)), -1e-3).round(4) for o in old]
    ref = [np.minimum(p + 0.4 * g.standard_normal(len(p)), -1e-3).round(4) for p in logp]
    mask = [(g.random(n) > 0.2).astype(int) for n in lengths]
    return {
        "per_token_logps": [r.tolist() for r in logp],
        "old_per_token_logps": [r.tolist() for r in old],
        "ref_per_token_logps": [r.tolist() for r in ref],
        "completion_mask": [r.tolist() for r in mask],
        "prompt_lengths": [int(g.integers(0, n)) for n in lengths],
        "rewards": g.integers(0, 3, rows).astype(float).tolist(),
        "group_size": group_size,
        "tokens": [[f"t{i}.{j}" for j in range(n)] for i, n in enumerate(lengths)],
    }


def library(body: dict[str, Any], preset: str = "article", **overrides: Any) -> grpo.Breakdown:
    """grpo's own breakdown of a request body, without the app."""
    fields = {k: v for k, v in body.items() if k not in ("tokens", "config", "token_rows")}
    return grpo.evaluate(batch_from_request(fields), grpo.LossConfig.from_preset(preset, **overrides))


def _same(json_value: Any, value: Any, np_dtype: Any) -> None:
    """One JSON value (or nested list) against one library value, bit for bit (null = NaN)."""
    got = np.asarray([math.nan if v is None else v for v in np.ravel(np.asarray(json_value, dtype=object))])
    want = np.ravel(np.asarray(value))
    assert got.shape == want.shape
    np.testing.assert_array_equal(got.astype(np_dtype), want.astype(np_dtype))


def assert_same_numbers(data: dict[str, Any], bd: grpo.Breakdown, lengths: list[int]) -> None:
    """The API's response holds the library's numbers unchanged: scalars, metrics, rows, tokens."""
    np_dtype = np.float32 if bd.dtype == "float32" else np.float64
    for name in ("loss", "objective", "policy_loss", "kl_loss"):
        assert data[name] == float(getattr(bd, name)), name
    assert set(data["metrics"]) == set(bd.metrics)
    for name, value in bd.metrics.items():
        assert data["metrics"][name] == (None if math.isnan(value) else value), name
    _same(data["advantages"], bd.advantages.numpy(), np_dtype)
    for name in ROW_FIELDS:
        value = getattr(bd.rows, name)
        if value is None:
            assert data["rows"][name] is None
        else:
            _same(data["rows"][name], value.numpy() if isinstance(value, torch.Tensor) else value, np_dtype)
    assert data["config"] == bd.config.to_dict()
    assert (data["device"], data["dtype"], data["warnings"]) == (bd.device, bd.dtype, list(bd.warnings))
    for name in TOKEN_FIELDS:
        rows = data["tokens"][name]
        assert [len(r) for r in rows] == lengths, name  # ragged like the input
        full = getattr(bd.tokens, name).detach().numpy()
        for i, row in enumerate(rows):
            _same(row, full[i, : lengths[i]], np_dtype)
    names = bd.tokens.region_names()
    assert data["tokens"]["region"] == [names[i][: lengths[i]] for i in range(len(lengths))]


def error_detail(response: httpx.Response, status: int) -> list[dict[str, Any]]:
    """The API's one error shape: FastAPI's {"detail": [{"loc", "msg", "type"}, ...]}, no traceback."""
    assert response.status_code == status, response.text[:500]
    assert response.headers["content-type"].startswith("application/json")
    assert "Traceback" not in response.text and 'File "' not in response.text
    body = response.json()
    assert list(body) == ["detail"]
    detail = body["detail"]
    assert isinstance(detail, list) and detail
    for entry in detail:
        assert {"loc", "msg", "type"} <= set(entry)
        assert isinstance(entry["loc"], list)
        assert status >= 500 or entry["loc"][0] in ("body", "path", "method")  # where in the request
        assert isinstance(entry["msg"], str) and entry["msg"]
    return detail


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serve(
    env: dict[str, str] | None = None,
    timeout: float = 120.0,
    memory_cap: int | None = None,
    http: str = "auto",
    pids: list[int] | None = None,
) -> Iterator[str]:
    """``uvicorn app.main:app`` on a free loopback port; yields its base URL, stops it after
    (its process id goes into ``pids`` where given).

    ``memory_cap`` (bytes) is the server's RLIMIT_AS, its worker processes' too: a request that would
    allocate without bound fails (MemoryError) instead of pushing the machine into the OOM killer.
    """
    port = free_port()

    def cap() -> None:
        if memory_cap is not None:
            resource.setrlimit(resource.RLIMIT_AS, (memory_cap, memory_cap))

    cmd = [sys.executable, "-m", "uvicorn", "app.main:app", "--host", "127.0.0.1", "--port", str(port), "--http", http]
    # stderr to a file, not a pipe: a server kept for a whole session never blocks on a full pipe
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env={**os.environ, **(env or {})},
            stdout=subprocess.DEVNULL,
            stderr=log,
            preexec_fn=cap,
        )
        url = f"http://127.0.0.1:{port}"
        if pids is not None:
            pids.append(proc.pid)
        try:
            deadline = time.monotonic() + timeout
            while True:
                if proc.poll() is not None:
                    log.seek(0)
                    raise RuntimeError(f"uvicorn exited: {log.read().decode(errors='replace')}")
                try:
                    if httpx.get(f"{url}/healthz", timeout=1.0).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError("uvicorn did not answer /healthz in time")
                time.sleep(0.1)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
