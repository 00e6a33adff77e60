"""Hostile decoders, each finding one test.

- A compressed upload is priced by what its read fields would unpack to, from the zip's directory and the
  headers, before anything is decompressed: a 125 KB NPZ or .pt holding 64M float16 zeros took 2.5 GB
  (turned into a Python list) and got a 200. Measured as the in-process app's peak RSS above its level
  before the request (the ASGI client runs every lane in this process's threads).
- An export is priced before it is built, against the same budget.
- Odd tensors (byte order, float128, huge ints, sparse, quantized, meta, complex, non-contiguous) are read
  (big-endian and non-contiguous: as native, contiguous copies) or refused with a 422 naming the tensor;
  ``python -m grpo eval`` the same with exit 2 and one line.
- Per-token advantages survive export -> upload in every format; JSONL lines end at "\\n" alone (U+2028,
  which orjson writes raw, is a character); eval refuses a FIFO at once.
"""

from __future__ import annotations

import gc
import io
import os
import subprocess
import sys
import threading
import warnings
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from api_fixtures import ROOT, client, error_detail
from fastapi.testclient import TestClient

from app.settings import get_settings
from grpo.__main__ import main
from grpo.io import load_file

MB = 1024 * 1024
ZEROS = 64_000_000  # float16 zeros: 128 MB unpacked, about 125 KB deflated
LOGPS = np.array([[-1.0, -0.5, -0.25], [-0.2, -0.1, -2.0]])
BATCH = {"per_token_logps": LOGPS, "old_per_token_logps": LOGPS * 0.9, "rewards": np.array([1.0, 0.0])}


@pytest.fixture(scope="module")
def api() -> TestClient:
    return client(raise_server_exceptions=False)


def upload(api: TestClient, name: str, data: bytes) -> Any:
    return api.post("/api/v1/upload", files={"file": (name, data)})


def loss_of(api: TestClient, fields: dict[str, Any]) -> float:
    body = {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in fields.items()}
    response = api.post("/api/v1/loss", json=body)
    assert response.status_code == 200, response.text[:300]
    return float(response.json()["loss"])


def rss() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@contextmanager
def peak_growth() -> Iterator[list[int]]:
    """The process's peak resident memory above its level at entry (sampled every millisecond), in [0]."""
    gc.collect()
    base, peak, done = rss(), [0], threading.Event()

    def sample() -> None:
        while not done.wait(0.001):
            peak[0] = max(peak[0], rss())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    grown = [0]
    try:
        yield grown
    finally:
        done.set()
        sampler.join()
        grown[0] = max(peak[0], rss()) - base


# --- 1. a compressed upload is priced by what it would unpack to ------------------------------------------
def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, array)
    return buffer.getvalue()


def npz_bomb(big: str) -> bytes:
    """The batch, and ``big``: 64M float16 zeros written deflated a megabyte at a time (never held whole)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, array in BATCH.items():
            if name != big:
                archive.writestr(f"{name}.npy", npy(array))
        with archive.open(f"{big}.npy", "w", force_zip64=True) as member:
            header = {"descr": "<f2", "fortran_order": False, "shape": (ZEROS,)}
            np.lib.format.write_array_header_1_0(member, header)
            for start in range(0, 2 * ZEROS, MB):
                member.write(bytes(min(MB, 2 * ZEROS - start)))
    return buffer.getvalue()


def pt_bomb(big: str, tmp: Path) -> bytes:
    """torch.save's file of the batch and ``big`` (64M float16 zeros), its entries deflated."""
    tensors = {name: torch.from_numpy(array) for name, array in BATCH.items() if name != big}
    torch.save(tensors | {big: torch.zeros(ZEROS, dtype=torch.float16)}, tmp / "stored.pt")
    buffer = io.BytesIO()
    with zipfile.ZipFile(tmp / "stored.pt") as stored, zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as out:
        for info in stored.infolist():
            with stored.open(info) as src, out.open(info.filename, "w", force_zip64=True) as dst:
                while chunk := src.read(MB):
                    dst.write(chunk)
    (tmp / "stored.pt").unlink()
    return buffer.getvalue()


@pytest.fixture(scope="module")
def bombs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    tmp = tmp_path_factory.mktemp("bombs")
    files = {f"{big}.npz": npz_bomb(big) for big in ("junk", "rewards")}
    files |= {f"{big}.pt": pt_bomb(big, tmp) for big in ("junk", "rewards")}
    gc.collect()
    assert all(len(data) < 400_000 for data in files.values()), {k: len(v) for k, v in files.items()}
    return files


@pytest.mark.parametrize("fmt", ["npz", "pt"])
def test_a_compressed_bomb_under_a_name_no_field_reads_is_never_unpacked(
    api: TestClient, bombs: dict[str, bytes], fmt: str
) -> None:
    """64M float16 zeros under ``junk`` beside a valid batch: answered, the tensor reported as ignored and
    never decompressed (it was unpacked and made a 64M-float Python list: +2.5 GB)."""
    with peak_growth() as grown:
        response = upload(api, f"batch.{fmt}", bombs[f"junk.{fmt}"])
    assert response.status_code == 200, response.text[:300]
    assert "Ignored 'junk' in the file: not a batch field." in response.json()["warnings"]
    assert grown[0] < 200 * MB, f"peak RSS +{grown[0] // MB} MB"


@pytest.mark.parametrize("fmt", ["npz", "pt"])
def test_a_compressed_bomb_in_a_field_read_is_a_413_before_it_unpacks(
    api: TestClient, bombs: dict[str, bytes], fmt: str
) -> None:
    """64M float16 zeros as ``rewards``: 128 MB unpacked, 512 MB as the batch holds them (8 bytes a value),
    past the 256 MB default: a 413 naming the entry and the sizes, before anything is decompressed."""
    assert get_settings().max_unpacked_bytes == 256 * MB
    with peak_growth() as grown:
        detail = error_detail(upload(api, f"batch.{fmt}", bombs[f"rewards.{fmt}"]), 413)
    assert detail[0]["loc"] == ["body", "file", "rewards"], detail
    assert "at most 268435456 bytes once unpacked" in detail[0]["msg"] and "64000000 values" in detail[0]["msg"]
    assert grown[0] < 200 * MB, f"peak RSS +{grown[0] // MB} MB"


def test_a_stride_zero_view_is_priced_by_its_values_not_its_storage(api: TestClient) -> None:
    """A .pt storage of one float16 viewed as 64M values (stride 0): a 1.6 KB file; it was made a Python list."""
    buffer = io.BytesIO()
    torch.save({"per_token_logps": torch.from_numpy(LOGPS), "rewards": torch.zeros(1).expand(ZEROS)}, buffer)
    with peak_growth() as grown:
        detail = error_detail(upload(api, "view.pt", buffer.getvalue()), 413)
    assert detail[0]["loc"] == ["body", "file", "rewards"] and "64000000 values" in detail[0]["msg"], detail
    assert grown[0] < 200 * MB, f"peak RSS +{grown[0] // MB} MB"


def test_per_row_fields_stay_arrays() -> None:
    """Nothing a binary file holds becomes a Python list of numbers."""
    buffer = io.BytesIO()
    np.savez(buffer, **BATCH)
    for name, data in (("b.npz", buffer.getvalue()), ("b.pt", pt_bytes(BATCH))):
        fields = load_file(name, data)
        assert isinstance(fields["rewards"], np.ndarray) and fields["rewards"].tolist() == [1.0, 0.0], name


# --- 7. an export is priced before it is built -------------------------------------------------------------
def test_an_export_past_the_unpack_budget_is_a_413_before_it_is_built(api: TestClient) -> None:
    """40,000 positions and one 2,000-character token: a 360 KB body whose NPZ pads every display string to
    the longest, 320 MB (a 963 KB body made a 721 MB NPZ and +2.5 GB). Past the 256 MB budget an upload of
    it would be read under: a 413 naming the tokens, before any array is built."""
    lengths = [1000] * 40
    tokens = [["t"] * n for n in lengths]
    tokens[0][0] = "x" * 2000
    body = {"per_token_logps": [[-0.5] * n for n in lengths], "rewards": [1.0, 0.0] * 20, "tokens": tokens}
    with peak_growth() as grown:
        detail = error_detail(api.post("/api/v1/export/npz", json=body), 413)
    assert detail[0]["loc"] == ["body", "tokens"] and "at most 256 MB per file" in detail[0]["msg"], detail
    assert grown[0] < 200 * MB, f"peak RSS +{grown[0] // MB} MB"
    assert api.post("/api/v1/export/json", json=body).status_code == 200  # each string once: 0.5 MB


# --- 9. odd tensors: read as native, contiguous arrays, or refused naming the tensor -----------------------
def pt_bytes(tensors: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    torch.save({k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in tensors.items()}, buffer)
    return buffer.getvalue()


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def quantized() -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantized tensors are deprecated: still what a file may hold
        return torch.quantize_per_tensor(torch.from_numpy(LOGPS).float(), 0.01, 0, torch.qint32)


ODD: dict[str, tuple[Callable[[], bytes], str | None]] = {  # file -> (its bytes, the tensor refused; None: read)
    "big-endian.npz": (lambda: npz_bytes({k: v.astype(">f8") for k, v in BATCH.items()}), None),
    "fortran-order.npz": (lambda: npz_bytes({k: np.asfortranarray(v) for k, v in BATCH.items()}), None),
    "float128.npz": (lambda: npz_bytes(BATCH | {"per_token_logps": LOGPS.astype(np.longdouble)}), "per_token_logps"),
    "non-contiguous.pt": (lambda: pt_bytes(BATCH | {"per_token_logps": torch.from_numpy(LOGPS.T.copy()).T}), None),
    "huge-int.pt": (lambda: pt_bytes(BATCH | {"group_size": 2**70}), "group_size"),
    "sparse.pt": (
        lambda: pt_bytes(BATCH | {"per_token_logps": torch.from_numpy(LOGPS).to_sparse()}),
        "per_token_logps",
    ),
    "quantized.pt": (lambda: pt_bytes(BATCH | {"per_token_logps": quantized()}), "per_token_logps"),
    "meta.pt": (lambda: pt_bytes(BATCH | {"per_token_logps": torch.empty(2, 3, device="meta")}), "per_token_logps"),
    "complex.pt": (
        lambda: pt_bytes(BATCH | {"per_token_logps": torch.from_numpy(LOGPS) * (1 + 1j)}),
        "per_token_logps",
    ),
}


@pytest.mark.parametrize("name", list(ODD))
def test_an_odd_tensor_is_read_or_refused_by_name(api: TestClient, name: str) -> None:
    data, refused = ODD[name][0](), ODD[name][1]
    response = upload(api, name, data)
    if refused is None:  # the same batch as its plain arrays
        assert response.status_code == 200, response.text[:300]
        assert response.json()["loss"] == loss_of(api, BATCH)
    else:
        detail = error_detail(response, 422)
        assert detail[0]["loc"] == ["body", refused] and refused in detail[0]["msg"], detail


@pytest.mark.parametrize("name", list(ODD))
def test_eval_reads_an_odd_tensor_or_exits_2_with_one_line(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / name).write_bytes(ODD[name][0]())
    code = main(["eval", str(tmp_path / name)])
    err = capsys.readouterr().err
    refused = ODD[name][1]
    if refused is None:
        assert code == 0, err
    else:
        assert code == 2 and err.startswith(f"error: {refused}: expected") and err.count("\n") == 1, err


# --- 11. round trips, JSONL lines, complex values, FIFOs -----------------------------------------------------
PER_TOKEN_ADVANTAGES = {
    "per_token_logps": [[-0.5, -1.0, -0.2], [-0.3], [-0.7, -0.1]],
    "old_per_token_logps": [[-0.4, -1.1, -0.2], [-0.2], [-0.8, -0.1]],
    "advantages": [[0.5, -1.0, 0.25], [2.0], [-0.5, 0.75]],
}


@pytest.mark.parametrize("fmt", ["json", "jsonl", "safetensors", "npz"])
def test_per_token_advantages_round_trip_in_every_format(api: TestClient, fmt: str) -> None:
    """JSON wrote the padded (B, T) matrix (rows of the wrong length); JSONL the whole matrix on every line."""
    rows = 400
    body = {k: v * (rows // 3) for k, v in PER_TOKEN_ADVANTAGES.items()}
    exported = api.post(f"/api/v1/export/{fmt}", json=body)
    assert exported.status_code == 200, exported.text[:300]
    assert len(exported.content) < 200_000  # ~rows x 3 fields x 3 numbers; JSONL's matrix a line: 8 MB
    uploaded = upload(api, f"batch.{fmt}", exported.content)
    assert uploaded.status_code == 200, uploaded.text[:300]
    assert uploaded.json()["loss"] == loss_of(api, body)
    assert uploaded.json()["advantage_per_token"] == api.post("/api/v1/loss", json=body).json()["advantage_per_token"]


def test_jsonl_lines_end_at_newline_alone(api: TestClient) -> None:
    """orjson writes U+2028, U+2029 and U+0085 raw inside strings, and str.splitlines split lines at each:
    the server's own export did not read back."""
    body = dict(PER_TOKEN_ADVANTAGES) | {"tokens": [["a\u2028b", "c\u2029", "\x85"], ["\x1c\x1d\x1e"], ["d", "e\r"]]}
    exported = api.post("/api/v1/export/jsonl", json=body)
    assert exported.status_code == 200 and "\u2028".encode() in exported.content
    assert load_file("batch.jsonl", exported.content)["tokens"] == body["tokens"]
    uploaded = upload(api, "batch.jsonl", exported.content)
    assert uploaded.status_code == 200, uploaded.text[:300]
    assert uploaded.json()["loss"] == loss_of(api, PER_TOKEN_ADVANTAGES)


def test_eval_refuses_a_fifo_at_once(tmp_path: Path) -> None:
    """A FIFO's read waits for a writer: eval hung. Refused before reading: exit 2, one line."""
    fifo = tmp_path / "batch.json"
    os.mkfifo(fifo)
    done = subprocess.run(
        [sys.executable, "-m", "grpo", "eval", str(fifo)], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "a regular file" in done.stderr, done.stderr
