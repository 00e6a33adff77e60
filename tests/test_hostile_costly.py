"""The costly lane, attacked by one member: what a small file would unpack to, and a queue one loop could fill.

- A 60 KB ``.npz`` whose ``per_token_logps`` holds 31,457,280 float16 zeros (7,680 x 4,096: priced 240 MiB,
  under the 256 MiB unpack limit) was unpacked, 63 MB, before its 413 for too many padded positions. Its grid
  is now priced from the member's .npy header (``grpo.io.file_shapes``, ``app.ingest.check_file_grid``) in the
  small-request threads, and refused with nothing of its data decompressed.
- The worker process and its queue are places for every member's costly requests: one member looping costly
  requests from four clients held them all and another member's got only 503s. A member now holds at most
  ``process_queue_per_client`` of them, and always one fewer than all (``app.lanes``).
"""

from __future__ import annotations

import io
import json
import threading
import time
import zipfile
from collections import Counter
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from api_fixtures import serve
from fastapi.testclient import TestClient

import grpo.io
from app.main import create_app
from app.settings import Settings

ROWS, TOKENS = 7680, 4096  # 31,457,280 positions; x 8 bytes held = 251,658,240 bytes, under 268,435,456
MAX_TOKENS = Settings().max_tokens  # 4,194,304


def zeros_npz() -> bytes:
    buffer = io.BytesIO()
    np.savez_compressed(buffer, per_token_logps=np.zeros((ROWS, TOKENS), np.float16), rewards=np.zeros(ROWS))
    return buffer.getvalue()


@pytest.fixture
def unpacked(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Bytes read out of every zip member (what its decompressor gave), and given to safetensors' loader under
    "safetensors", while the test runs."""
    import safetensors.torch

    counted: Counter[str] = Counter()
    read, load = zipfile.ZipExtFile.read, safetensors.torch.load

    def loading(data: bytes) -> object:
        counted["safetensors"] += len(data)
        return load(data)

    def counting(self: zipfile.ZipExtFile, n: int = -1) -> bytes:
        data = read(self, n)
        counted[self.name] += len(data)
        return data

    monkeypatch.setattr(zipfile.ZipExtFile, "read", counting)
    monkeypatch.setattr(safetensors.torch, "load", loading)
    return counted


def refuse(http: TestClient, data: bytes) -> tuple[httpx.Response, float]:
    start = time.perf_counter()
    response = http.post("/api/v1/upload", files={"file": ("zeros.npz", data)})
    return response, time.perf_counter() - start


def test_a_small_npz_past_the_position_limit_is_refused_before_it_is_unpacked(unpacked: Counter[str]) -> None:
    """413 naming per_token_logps and max_tokens, in the small threads, with at most the .npy headers read (a
    few KB: zipfile decompresses 4 KB at least per read) of the 63 MB the array unpacks to; in a fraction of
    the time unpacking it takes. Before: the member was unpacked (63 MB read), then refused in the costly lane."""
    data = zeros_npz()
    assert len(data) < 100 * 1024
    http = TestClient(create_app(Settings()))
    lanes = http.app.state.lanes  # type: ignore[attr-defined]
    response, _ = refuse(http, data)
    assert response.status_code == 413, response.text[:300]
    (error,) = response.json()["detail"]
    assert error["loc"] == ["body", "per_token_logps"]
    assert f"{ROWS * TOKENS} positions" in error["msg"] and f"at most {MAX_TOKENS} padded positions" in error["msg"]
    assert sum(unpacked.values()) < 64 * 1024, dict(unpacked)
    assert dict(lanes.used) == {"small": 1}  # never escalated to the costly lane
    unpack = min(timed_unpack(data) for _ in range(3))
    refused = min(refuse(http, data)[1] for _ in range(3))
    # the refusal reads a zip directory, two headers and a 60 KB multipart body; the unpack inflates 63 MB
    assert refused < unpack / 4, (refused, unpack)


def test_a_one_dimensional_grid_is_refused_from_its_header(unpacked: Counter[str]) -> None:
    """per_token_logps of 30M values in one dimension (priced 240 MiB, under the unpack limit) is no (B, T) grid:
    a 4xx naming it, from its header, its 60 MB of data never decompressed. Before: unpacked, then refused."""
    buffer = io.BytesIO()
    np.savez_compressed(buffer, per_token_logps=np.zeros(ROWS * TOKENS, np.float16), rewards=np.zeros(4))
    response = TestClient(create_app(Settings())).post(
        "/api/v1/upload", files={"file": ("flat.npz", buffer.getvalue())}
    )
    assert response.status_code == 422, response.text[:300]
    assert "per_token_logps" in response.json()["detail"][0]["loc"]
    assert "2-D" in response.json()["detail"][0]["msg"]
    assert sum(unpacked.values()) < 64 * 1024, dict(unpacked)


def timed_unpack(data: bytes) -> float:
    start = time.perf_counter()
    with np.load(io.BytesIO(data)) as archive:
        archive["per_token_logps"]
    return time.perf_counter() - start


@pytest.mark.parametrize("fmt", ["pt", "safetensors"])
def test_the_other_binary_formats_are_priced_by_their_headers(fmt: str, unpacked: Counter[str]) -> None:
    """The same grid from a .pt (its pickle's view sizes; no storage read) and a safetensors header."""
    import torch
    from safetensors.torch import save

    tensors = {"per_token_logps": torch.zeros(2049, 2048, dtype=torch.float16), "rewards": torch.zeros(2049)}
    if fmt == "pt":
        buffer = io.BytesIO()
        torch.save(tensors, buffer)
        data = buffer.getvalue()
    else:
        data = save(tensors)
    response = TestClient(create_app(Settings())).post("/api/v1/upload", files={"file": (f"zeros.{fmt}", data)})
    assert response.status_code == 413, response.text[:300]
    assert response.json()["detail"][0]["loc"] == ["body", "per_token_logps"]
    assert f"{2049 * 2048} positions" in response.json()["detail"][0]["msg"]
    assert not any("/data/" in name or name == "safetensors" for name in unpacked), dict(unpacked)
    assert grpo.io.file_shapes(f"zeros.{fmt}", data) == {"per_token_logps": (2049, 2048), "rewards": (2049,)}


# --- the costly lane's places, per member ---------------------------------------------------------------------
# One row of 8,192 tokens and 127 of one: 1,048,576 padded positions from a body of about 50 KB, priced
# 1,048,576 x (8 x 2 + 160) bytes = 176 MiB at /loss: past the 8 MiB cheap limit set below, so each goes to
# the worker process (about 0.3 s of evaluate there), and one member's four looping clients would fill its
# three places (one running, two waiting).
COSTLY = json.dumps(
    {"per_token_logps": [[-1.0] * 8192] + [[-1.0]] * 127, "rewards": [1.0, 0.0, 0.5, 0.25] * 32, "group_size": 4}
).encode()
SECONDS = 6.0  # how long member A loops; member B sends one request at a time meanwhile


@pytest.fixture(scope="module")
def pooled_server() -> Iterator[str]:
    env = {
        "GRPO_LENS_PROCESS_WORKERS": "1",
        "GRPO_LENS_PROCESS_QUEUE": "2",
        "GRPO_LENS_CHEAP_REQUEST_BYTES": str(8 * 1024 * 1024),
    }
    with serve(env) as url:
        yield url


def loop(url: str, address: str, stop: threading.Event, out: list[tuple[int, str]]) -> None:
    """Post COSTLY again and again from ``address`` (a loopback address of its own: a member) until ``stop``."""
    transport = httpx.HTTPTransport(local_address=address)
    with httpx.Client(base_url=url, timeout=60, transport=transport) as client:
        while not stop.is_set():
            response = client.post("/api/v1/loss", content=COSTLY, headers={"content-type": "application/json"})
            out.append((response.status_code, response.text[:300]))


def test_one_members_loop_never_keeps_another_out_of_the_costly_lane(pooled_server: str) -> None:
    """Member A (127.0.0.1) loops from four clients; member B (127.0.0.2) sends one at a time for the same
    6 s. B's every request is answered (200), A's past its share get 429 naming the setting. Before, A held all
    three places and B got 503s."""
    warm = httpx.post(
        f"{pooled_server}/api/v1/loss", content=COSTLY, headers={"content-type": "application/json"}, timeout=120
    )
    assert warm.status_code == 200, warm.text[:300]  # the worker process is up
    stop, a_out, b_out = threading.Event(), [], []  # type: ignore[var-annotated]
    members = [threading.Thread(target=loop, args=(pooled_server, "127.0.0.1", stop, a_out)) for _ in range(4)]
    for t in members:
        t.start()
    time.sleep(0.5)  # A's clients hold the places
    b = threading.Thread(target=loop, args=(pooled_server, "127.0.0.2", stop, b_out))
    b.start()
    time.sleep(SECONDS)
    stop.set()
    for t in [*members, b]:
        t.join(timeout=60)
    b_statuses = Counter(status for status, _ in b_out)
    a_statuses = Counter(status for status, _ in a_out)
    assert b_out and b_statuses == {200: len(b_out)}, (b_statuses, a_statuses, b_out[:2])
    assert a_statuses[429] > 0 and a_statuses[200] > 0, a_statuses
    assert all("process_queue_per_client" in text for status, text in a_out if status == 429)
    assert set(a_statuses) <= {200, 429, 503}, a_statuses
