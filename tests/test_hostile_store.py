"""The run store (app/store.py) against a hostile member of a team: names, atomic create, delete,
files outside the run, run.json and step-file validation, zip errors, the disk budget.

Each test sends what got a 500 (or a wrong answer) before the store existed and checks the answer
now, and that nothing half-written is left. Races are forced: a function of app.store is wrapped to
wait on a threading.Event between the check and the act, so "failed before" does not rest on luck.
In process (ASGI) throughout.
"""

from __future__ import annotations

import errno
import io
import json
import os
import struct
import threading
import zipfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from api_fixtures import error_detail
from fastapi.testclient import TestClient
from safetensors.torch import save
from test_api_runs import write_run
from test_runs import step_tensors

import app.runs
import app.store
from app.main import create_app
from app.settings import Settings
from app.store import RUN_NAME, RUN_NAME_PATTERN, RunStore
from grpo.errors import GrpoInputError
from grpo.runs import STEP_FILE, load_run, load_step, read_metadata

WAIT = 20.0  # seconds a forced pause waits at most (never reached when the code is right)


def make_client(root: Path, **settings: Any) -> TestClient:
    """No worker process unless asked: the runs here are tiny (thread lane), and a worker spawned per test
    would import torch for seconds only to be stopped."""
    settings.setdefault("process_workers", 0)
    return TestClient(create_app(Settings(runs_dir=str(root), **settings)), raise_server_exceptions=False)


@pytest.fixture
def runs(tmp_path: Path) -> Iterator[tuple[TestClient, Path]]:
    with make_client(tmp_path) as http:
        yield http, tmp_path


def zipped(members: list[tuple[str, str | bytes]], method: int = zipfile.ZIP_STORED) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", method) as archive:
        for name, data in members:
            archive.writestr(name, data)
    return buffer.getvalue()


def a_run(root: Path) -> tuple[dict[str, Any], bytes]:
    """A good run's run.json and its first step file's bytes (to tamper with)."""
    write_run(root, "model")
    info = json.loads((root / "model" / "run.json").read_text())
    return info, (root / "model" / "steps" / "000001-000.safetensors").read_bytes()


def upload(http: TestClient, name: str, data: bytes) -> Any:
    return http.post("/api/v1/runs", files={"file": ("u.zip", data)}, data={"name": name})


def leftovers(root: Path) -> list[str]:
    """What is under the runs directory besides the fixture's own run."""
    return sorted(p.name for p in root.iterdir() if p.name != "model")


def paused(monkeypatch: pytest.MonkeyPatch, name: str) -> tuple[threading.Event, threading.Event]:
    """Wrap app.store.<name> so its first call signals ``reached`` and waits for ``release``."""
    reached, release = threading.Event(), threading.Event()
    original: Callable[..., Any] = getattr(app.store, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not reached.is_set():
            reached.set()
            assert release.wait(WAIT)
        return original(*args, **kwargs)

    monkeypatch.setattr(app.store, name, wrapper)
    return reached, release


# --- names -------------------------------------------------------------------------------------------------
# RUN_NAME and STEP_FILE ended in "$" (matches before a trailing newline) and STEP_FILE used "\d" (any
# script's digits): "abc\n" became a run directory, and a step file named with Arabic-Indic digits was
# read as a second micro-batch 0 of step 1 (its loss counted twice). Now both are matched whole, ASCII only.
ARABIC_STEP = "\u0660" * 5 + "\u0661-" + "\u0660" * 3 + ".safetensors"


def test_names_are_matched_whole_and_ascii_only() -> None:
    assert RUN_NAME.fullmatch("run-1.a_b") and RUN_NAME.pattern == RUN_NAME_PATTERN
    for name in ("abc\n", "\uff41bc", "a" * 129, ".hidden", "a/b", ""):
        assert RUN_NAME.fullmatch(name) is None, repr(name)
    assert STEP_FILE.fullmatch("000001-000-rank2.safetensors")
    for name in (ARABIC_STEP, "000001-000.safetensors\n", "000001-000.safetensorsx", "\uff10" * 6 + "-000.safetensors"):
        assert STEP_FILE.fullmatch(name) is None, repr(name)


def test_a_name_with_a_trailing_newline_is_refused(runs: tuple[TestClient, Path]) -> None:
    http, root = runs
    info, _ = a_run(root)
    detail = error_detail(upload(http, "abc\n", zipped([("run.json", json.dumps(info))])), 422)
    assert detail[0]["loc"][-1] == "name", detail
    assert leftovers(root) == []


def test_a_step_file_named_with_other_digits_is_not_a_step(runs: tuple[TestClient, Path]) -> None:
    http, root = runs
    info, step = a_run(root)
    members = [("run.json", json.dumps(info)), (f"steps/{ARABIC_STEP}", step)]
    assert "steps/NNNNNN-NNN" in error_detail(upload(http, "u", zipped(members)), 422)[0]["msg"]
    (root / "model" / "steps" / ARABIC_STEP).write_bytes(step)  # on disk, written by another hand
    assert [(s.step, s.micro) for s in load_run(root / "model").steps] == [(1, 0), (1, 1), (2, 0), (2, 1)]


# --- atomic create -----------------------------------------------------------------------------------------
# Six concurrent uploads of one name: each checked that the name was free, then unpacked and renamed
# its run into place; one got 201 and five a 500 (the rename onto a non-empty directory). Now the name is
# reserved by one os.mkdir before anything is written: one 201, five 409s, even with the first upload
# held in the middle of writing its files.
def test_concurrent_uploads_of_one_name_get_one_201_and_409s(
    runs: tuple[TestClient, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    http, root = runs
    info, step = a_run(root)
    data = zipped([("run.json", json.dumps(info)), ("steps/000001-000.safetensors", step)])
    reached, release = paused(monkeypatch, "copy_member")
    with ThreadPoolExecutor(6) as pool:
        first = pool.submit(upload, http, "same", data)
        assert reached.wait(WAIT)  # the first holds its reservation, half-written
        others = [pool.submit(upload, http, "same", data) for _ in range(5)]
        statuses = [f.result().status_code for f in others]
        release.set()
        assert first.result().status_code == 201, first.result().text
    assert statuses == [409] * 5
    assert leftovers(root) == ["same"] and load_run(root / "same").info["uploaded"] is True


def test_a_name_reserved_by_the_lab_is_taken_for_uploads(runs: tuple[TestClient, Path]) -> None:
    http, root = runs
    info, _ = a_run(root)
    store: RunStore = http.app.state.store  # type: ignore[attr-defined]
    store.reserve("lab-run")
    detail = error_detail(upload(http, "lab-run", zipped([("run.json", json.dumps(info))])), 409)
    assert detail[0]["loc"] == ["body", "name"]
    assert list((root / "lab-run").iterdir()) == []  # the reservation is left as it was
    with pytest.raises(Exception) as taken:
        store.reserve("lab-run")
    assert getattr(taken.value, "status", None) == 409


# --- delete ------------------------------------------------------------------------------------------------
# A run directory that is a symbolic link: DELETE renamed the link to .deleting-<run>, then rmtree refused
# it: a 500, and the .deleting-* link stayed. Now a link is no run of the store: 404 on every route,
# never deleted through, and the directory it points to is untouched.
def test_a_run_directory_that_is_a_link_is_no_run(runs: tuple[TestClient, Path], tmp_path_factory: Any) -> None:
    http, root = runs
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    write_run(elsewhere, "target")
    (root / "linked").symlink_to(elsewhere / "target")
    for response in (http.delete("/api/v1/runs/linked"), http.get("/api/v1/runs/linked/download")):
        assert error_detail(response, 404)[0]["loc"] == ["path", "run"]
    assert "linked" not in [r["name"] for r in http.get("/api/v1/runs").json()]
    assert (root / "linked").is_symlink() and (elsewhere / "target" / "run.json").is_file()
    assert leftovers(root) == ["linked"]


def test_staged_directories_a_crash_left_are_swept_at_start(tmp_path: Path) -> None:
    for name in (".upload-a-x1", ".deleting-b-x2"):
        (tmp_path / name / "steps").mkdir(parents=True)
        (tmp_path / name / "run.json").write_text("{}")
    (tmp_path / "reserved").mkdir()  # a reservation never filled
    write_run(tmp_path, "kept")
    with make_client(tmp_path):
        assert sorted(p.name for p in tmp_path.iterdir()) == ["kept"]


# A download racing a DELETE: the zip was built from paths the DELETE renamed away: a 500. Now the
# download reads the run through its directory opened once and answers a 404 when the run went
# while it was zipped (a DELETE renames it first), or a whole zip; never a 500.
def test_a_download_racing_a_delete_is_a_404_or_a_whole_zip(
    runs: tuple[TestClient, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    http, root = runs
    a_run(root)
    reached, release = paused(monkeypatch, "_zip_file")
    with ThreadPoolExecutor(1) as pool:
        download = pool.submit(http.get, "/api/v1/runs/model/download")
        assert reached.wait(WAIT)  # the run's directory is open, no file zipped yet
        assert http.delete("/api/v1/runs/model").status_code == 204
        release.set()
        response = download.result()
    assert error_detail(response, 404)[0]["loc"] == ["path", "run"]
    assert list(root.iterdir()) == []


class FakeLab:
    """The lab manager's side of a DELETE (app.lab_workers.LabManager.remove): records the call and
    whether the run's directory was still there when the worker was asked to let go."""

    def __init__(self, root: Path, run_id: str) -> None:
        self.runs = {run_id: object()}
        self.root = root
        self.calls: list[tuple[str, float, bool]] = []

    async def remove(self, run_id: str, timeout: float) -> None:
        self.calls.append((run_id, timeout, (self.root / run_id / "run.json").is_file()))


# A DELETE of a running lab run removed its directory under the worker: 204, then the worker died and
# the next cancel was a 500. Now the DELETE asks the lab to cancel the run and wait for its worker
# (up to a bound), and only then removes the directory.
def test_deleting_a_lab_run_cancels_it_and_waits_for_its_worker_first(runs: tuple[TestClient, Path]) -> None:
    http, root = runs
    write_run(root, "lab-1")
    lab = FakeLab(root, "lab-1")
    http.app.state.lab = lab  # type: ignore[attr-defined]
    assert http.delete("/api/v1/runs/lab-1").status_code == 204
    assert lab.calls == [("lab-1", app.store.LAB_REMOVE_SECONDS, True)]
    assert not (root / "lab-1").exists() and list(root.iterdir()) == []
    write_run(root, "not-lab")
    assert http.delete("/api/v1/runs/not-lab").status_code == 204 and len(lab.calls) == 1


# --- files outside the run ---------------------------------------------------------------------------------
# A step file symlinked to /etc/passwd (or /proc/self/environ, which holds the token) was served inside
# GET .../download. Now only regular files inside the run are read: the link is left out of the zip and
# out of the run's steps, and the library refuses to read one.
def test_a_step_file_that_is_a_link_is_never_read(runs: tuple[TestClient, Path], tmp_path_factory: Any) -> None:
    http, root = runs
    a_run(root)
    secret = tmp_path_factory.mktemp("outside") / "secret"
    secret.write_text("TOKEN=hunter2")
    link = root / "model" / "steps" / "000003-000.safetensors"
    link.symlink_to(secret)
    response = http.get("/api/v1/runs/model/download")
    assert response.status_code == 200
    archive = zipfile.ZipFile(io.BytesIO(response.content))
    assert "steps/000003-000.safetensors" not in archive.namelist() and len(archive.namelist()) == 5
    assert b"hunter2" not in b"".join(archive.read(n) for n in archive.namelist())
    assert 3 not in load_run(root / "model").step_numbers()
    with pytest.raises(GrpoInputError, match="not a link"):
        load_step(link)


def test_a_run_json_that_is_a_link_is_no_run(runs: tuple[TestClient, Path], tmp_path_factory: Any) -> None:
    http, root = runs
    info, _ = a_run(root)
    outside = tmp_path_factory.mktemp("outside") / "run.json"
    outside.write_text(json.dumps(info))
    (root / "model" / "run.json").unlink()
    (root / "model" / "run.json").symlink_to(outside)
    assert http.get("/api/v1/runs/model/download").status_code == 404
    assert http.get("/api/v1/runs/model").status_code == 404


def test_a_large_download_gives_its_memory_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    released: list[bool] = []
    monkeypatch.setattr(app.runs, "release_memory", lambda: released.append(True))
    write_run(tmp_path, "r")
    with make_client(tmp_path, large_request_bytes=0) as http:
        response = http.get("/api/v1/runs/r/download")
    assert response.status_code == 200 and int(response.headers["content-length"]) == len(response.content)
    assert zipfile.ZipFile(io.BytesIO(response.content)).testzip() is None
    assert released == [True]


# --- run.json and step files: every bad field a 422 naming it, nothing written ------------------------------
def _step(step: bytes, change: str) -> bytes:
    meta = read_metadata(step)
    tensors = step_tensors(1)
    if change == "group_size-nan":
        tensors["group_size"] = torch.tensor(float("nan"))
    elif change == "preset-list":
        meta["config"] = json.dumps({"preset": []})
    elif change == "float8-logps":
        tensors["per_token_logps"] = tensors["per_token_logps"].to(torch.float8_e4m3fn)
    elif change == "row_rewards-2d":
        tensors["row_rewards"] = torch.zeros(2, 2)
    elif change == "meta-deep":
        meta["meta"] = "[" * 300 + "]" * 300
    return save(tensors, metadata=meta)


# A source nested 300 deep: the upload was a 500, the run stayed, and GET /api/v1/runs was a 500 for
# everyone. A source never checked; logged as a list (the run's page a 500).
@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"source": json.loads("[" * 300 + "]" * 300)}, "source"),
        ({"source": "evil"}, "source"),
        ({"logged": [1, 2]}, "logged"),
        ({"lab": json.loads('{"a":' * 300 + "1" + "}" * 300)}, "lab"),
        ({"versions": {"torch": [2]}}, "versions"),
        ({"config": {"preset": []}}, "preset"),
        ({"status": {"x": 1}}, "status"),
    ],
    ids=["source-deep", "source-unknown", "logged-list", "other-deep", "versions-list", "config-preset", "status"],
)
def test_a_bad_run_json_field_is_a_422_naming_it(
    runs: tuple[TestClient, Path], change: dict[str, Any], field: str
) -> None:
    http, root = runs
    info, step = a_run(root)
    members = [("run.json", json.dumps(info | change)), ("steps/000001-000.safetensors", step)]
    detail = error_detail(upload(http, "u", zipped(members)), 422)
    assert detail[0]["loc"] == ["body", "file", "run.json", field], detail
    assert leftovers(root) == []
    assert http.get("/api/v1/runs").status_code == 200


# group_size NaN, preset [] and F8 log-probs in a step file: 500s at upload; a 2-D row_rewards was
# accepted and the run's page was a 500.
@pytest.mark.parametrize(
    ("change", "field"),
    [
        ("group_size-nan", "group_size"),
        ("preset-list", "preset"),
        ("float8-logps", "per_token_logps"),
        ("row_rewards-2d", "row_rewards"),
        ("meta-deep", "meta"),
    ],
)
def test_a_bad_step_file_field_is_a_422_naming_it(runs: tuple[TestClient, Path], change: str, field: str) -> None:
    http, root = runs
    info, step = a_run(root)
    members = [("run.json", json.dumps(info)), ("steps/000001-000.safetensors", _step(step, change))]
    detail = error_detail(upload(http, "u", zipped(members)), 422)
    assert detail[0]["loc"][-1] == field and "000001-000.safetensors" in detail[0]["msg"], detail
    assert leftovers(root) == []


# A zip naming run.json twice: the last one silently won. Now refused.
def test_a_duplicated_member_is_refused(runs: tuple[TestClient, Path]) -> None:
    http, root = runs
    info, _ = a_run(root)
    data = zipped([("run.json", json.dumps(info)), ("run.json", json.dumps(info | {"status": "other"}))])
    assert "more than once" in error_detail(upload(http, "u", data), 422)[0]["msg"]
    assert leftovers(root) == []


# A 243 KB zip holding a 250 MB run.json was accepted (and every listing re-read it). Now run.json is
# bounded (max_run_json_bytes, 1 MiB by default), from the zip's directory, before anything is read.
def test_a_run_json_past_its_bound_is_a_413(runs: tuple[TestClient, Path]) -> None:
    http, root = runs
    info, _ = a_run(root)
    big = json.dumps(info | {"padding": " " * (2 * 1024 * 1024)})
    data = zipped([("run.json", big)], zipfile.ZIP_DEFLATED)
    assert len(data) < 20_000
    detail = error_detail(upload(http, "u", data), 413)
    assert detail[0]["loc"] == ["body", "file", "run.json"] and "a setting" in detail[0]["msg"]
    assert leftovers(root) == []


# --- zip errors --------------------------------------------------------------------------------------------
def _patch(data: bytes, signature: bytes, offset: int, fmt: str, value: int) -> bytes:
    """Set a field of every local header (signature PK\\3\\4) or central directory entry (PK\\1\\2)."""
    out = bytearray(data)
    at = out.find(signature)
    while at >= 0:
        struct.pack_into(fmt, out, at + offset, value)
        at = out.find(signature, at + 4)
    return bytes(out)


def _bad_zip(kind: str, info: dict[str, Any]) -> bytes:
    text = json.dumps(info | {"notes": "x" * 4000})  # valid: any 422 below is the zip's
    if kind == "corrupt-deflate":
        data = bytearray(zipped([("run.json", text)], zipfile.ZIP_DEFLATED))
        start = 30 + len("run.json")
        data[start : start + 16] = b"\xff" * 16  # block type 3: invalid in deflate
        return bytes(data)
    data = zipped([("run.json", text)])
    if kind == "encrypted-flag":
        return _patch(_patch(data, b"PK\x03\x04", 6, "<H", 1), b"PK\x01\x02", 8, "<H", 1)
    if kind == "unknown-method":
        return _patch(_patch(data, b"PK\x03\x04", 8, "<H", 77), b"PK\x01\x02", 10, "<H", 77)
    if kind == "bad-crc":
        return _patch(_patch(data, b"PK\x03\x04", 14, "<I", 1), b"PK\x01\x02", 16, "<I", 1)
    if kind == "truncated-member":  # the directory says more bytes than the zip holds
        for signature, offset in ((b"PK\x03\x04", 18), (b"PK\x01\x02", 20)):  # compressed, then full size
            data = _patch(_patch(data, signature, offset, "<I", 500_000), signature, offset + 4, "<I", 500_000)
        return data
    return data[: len(data) // 2]  # truncated: no central directory


@pytest.mark.parametrize(
    "kind", ["corrupt-deflate", "encrypted-flag", "unknown-method", "bad-crc", "truncated-member", "truncated"]
)
def test_every_zip_error_is_a_422(runs: tuple[TestClient, Path], kind: str) -> None:
    http, root = runs
    info, _ = a_run(root)
    detail = error_detail(upload(http, "u", _bad_zip(kind, info)), 422)
    assert detail[0]["loc"] == ["body", "file"] and "readable zip" in detail[0]["msg"], detail
    assert leftovers(root) == []


# --- the disk budget ---------------------------------------------------------------------------------------
# No budget and no free-space check: ~250 KB of upload wrote 250 MB, and a full disk was a 500.
def test_an_upload_past_the_budget_is_a_507(tmp_path: Path) -> None:
    write_run(tmp_path, "model")
    info = json.loads((tmp_path / "model" / "run.json").read_text())
    used = sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file())
    data = zipped([("run.json", json.dumps(info) + " " * 5000)])
    with make_client(tmp_path, runs_max_bytes=used + 4000, runs_min_free_bytes=0) as http:
        store: RunStore = http.app.state.store  # type: ignore[attr-defined]
        assert store.remaining_bytes() == 4000
        detail = error_detail(upload(http, "u", data), 507)
        assert "GRPO_LENS_RUNS_MAX_BYTES" in detail[0]["msg"]
        (tmp_path / "model" / "steps" / "000009-000.safetensors").write_bytes(b"x" * 1000)  # a lab worker writes
        store._usage = None  # its next walk counts it (the TTL has passed)
        assert store.remaining_bytes() == 3000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
    with make_client(tmp_path, runs_max_bytes=0, runs_min_free_bytes=0) as http:
        assert http.app.state.store.remaining_bytes() is None  # type: ignore[attr-defined]
        assert upload(http, "u", data).status_code == 201


def test_an_upload_below_the_free_space_floor_is_a_507(tmp_path: Path) -> None:
    write_run(tmp_path, "model")
    info = json.loads((tmp_path / "model" / "run.json").read_text())
    with make_client(tmp_path, runs_max_bytes=0, runs_min_free_bytes=2**62) as http:
        detail = error_detail(upload(http, "u", zipped([("run.json", json.dumps(info))])), 507)
        assert "GRPO_LENS_RUNS_MIN_FREE_BYTES" in detail[0]["msg"]
        assert http.app.state.store.remaining_bytes() == 0  # type: ignore[attr-defined]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


# Two uploads beside each other, each alone within the budget: both checked the usage before either
# wrote. Now what one has claimed counts for the other: the second is a 507 while the first writes.
def test_concurrent_uploads_cannot_pass_the_budget_between_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_run(tmp_path, "model")
    info = json.loads((tmp_path / "model" / "run.json").read_text())
    used = sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file())
    data = zipped([("run.json", json.dumps(info) + " " * 3000)])
    reached, release = paused(monkeypatch, "copy_member")
    with make_client(tmp_path, runs_max_bytes=used + 5000, runs_min_free_bytes=0) as http:
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(upload, http, "a", data)
            assert reached.wait(WAIT)
            second = upload(http, "b", data)
            release.set()
            assert first.result().status_code == 201
        assert error_detail(second, 507)[0]["type"] == "insufficient_storage"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "model"]


def test_a_full_disk_while_writing_is_a_507_with_nothing_left(
    runs: tuple[TestClient, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    http, root = runs
    info, step = a_run(root)
    original = app.store.copy_member

    def disk_fills(archive: zipfile.ZipFile, member: zipfile.ZipInfo, out: Path) -> None:
        original(archive, member, out)
        if member.filename.startswith("steps/"):  # run.json written, then the disk is full
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(app.store, "copy_member", disk_fills)
    members = [("run.json", json.dumps(info)), ("steps/000001-000.safetensors", step)]
    detail = error_detail(upload(http, "u", zipped(members)), 507)
    assert "disk is full" in detail[0]["msg"]
    assert leftovers(root) == []
