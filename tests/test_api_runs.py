"""/api/v1/runs: list, detail, step (whole or ?micro=, ?config=), delete, download, replay, upload."""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from test_runs import step_tensors

import grpo
from app.main import create_app
from app.settings import Settings
from grpo.runs import RunWriter, load_step

CONFIG = grpo.LossConfig.from_preset("trl-grpo", beta=0.04, gradient_accumulation_steps=2)


def write_run(root: Path, name: str, tamper: bool = False) -> Path:
    """Two steps of two micro-batches; each meta holds the loss GRPO Lens computes (+0.01 in step 2 when tampered)."""
    writer = RunWriter(root / name, "trl", CONFIG)
    logged: dict[str, dict[str, float]] = {}
    for step in (1, 2):
        kls = []
        for micro in (0, 1):
            path = writer.write_step(step, micro, step_tensors(10 * step + micro), {})
            batch, config, _ = load_step(path)
            bd = grpo.evaluate(batch, config)
            loss = float(bd.loss) + (0.01 if tamper and step == 2 else 0.0)
            meta = {"loss": loss, "metrics": {"kl": bd.metrics["kl"]}}
            writer.write_step(step, micro, step_tensors(10 * step + micro), meta)
            kls.append(bd.metrics["kl"])
        logged[str(step)] = {"kl": sum(kls) / 2}
    writer.update(status="done", logged=logged)
    return root / name


@pytest.fixture
def runs_client(tmp_path: Path) -> Iterator[tuple[TestClient, Path]]:
    # No worker process: these runs are far under large_request_bytes, so every request takes the thread lane
    # anyway, and a worker spawned per test would import torch for seconds only to be stopped.
    settings = Settings(runs_dir=str(tmp_path), max_upload_bytes=200_000, process_workers=0)
    with TestClient(create_app(settings)) as http:
        yield http, tmp_path


def test_list_detail_and_flagged_mismatches(runs_client: tuple[TestClient, Path]) -> None:
    http, root = runs_client
    write_run(root, "good")
    write_run(root, "bad", tamper=True)
    listed = http.get("/api/v1/runs").json()
    assert sorted(r["name"] for r in listed) == ["bad", "good"] and all(r["steps"] == 2 for r in listed)
    good = http.get("/api/v1/runs/good").json()
    assert good["ok"] and [s["step"] for s in good["steps"]] == [1, 2]
    assert good["steps"][0]["logged"]["kl"] == pytest.approx(good["steps"][0]["lens_mean"]["kl"], abs=1e-7)
    bad = http.get("/api/v1/runs/bad").json()
    assert not bad["ok"] and [s["ok"] for s in bad["steps"]] == [True, False]
    assert {m["micro"] for m in bad["steps"][1]["mismatches"]} == {0, 1}


def test_step_whole_micro_and_config(runs_client: tuple[TestClient, Path]) -> None:
    http, root = runs_client
    write_run(root, "r")
    micro = http.get("/api/v1/runs/r/steps/2", params={"micro": 1}).json()
    info = load_step(root / "r" / "steps" / "000002-001.safetensors")[2]
    assert micro["breakdown"]["loss"] == pytest.approx(info["meta"]["loss"], rel=1e-6)
    assert micro["trainer"][0]["loss"] == info["meta"]["loss"]
    assert micro["request"]["config"]["gradient_accumulation_steps"] == 2
    whole = http.get("/api/v1/runs/r/steps/2").json()
    assert whole["micro_batches"] == [0, 1] and len(whole["request"]["per_token_logps"]) == 8
    assert whole["request"]["config"]["gradient_accumulation_steps"] == 1  # the step seen as one batch
    # the request it returns is a /api/v1/loss body: the page loads it into its views
    again = http.post("/api/v1/loss", json=whole["request"]).json()
    assert again["loss"] == pytest.approx(whole["breakdown"]["loss"], rel=1e-6)
    beta0 = http.get("/api/v1/runs/r/steps/2", params={"micro": 1, "config": '{"beta": 0}'}).json()
    assert beta0["breakdown"]["config"]["beta"] == 0 and beta0["breakdown"]["kl_loss"] == 0


@pytest.mark.parametrize(
    ("url", "status"),
    [
        ("/api/v1/runs/nope", 404),
        ("/api/v1/runs/..%2Fetc", 404),
        ("/api/v1/runs/r/steps/9", 404),
        ("/api/v1/runs/r/steps/1?micro=5", 404),
        ("/api/v1/runs/r/steps/x", 422),
        ("/api/v1/runs/r/steps/1?config=%7Bnot", 422),
        ("/api/v1/runs/r/steps/1?config=%7B%22beta%22%3A-1%7D", 422),
        ("/api/v1/runs/r/steps/1?config=%5B1%5D", 422),
    ],
)
def test_bad_requests_are_4xx(runs_client: tuple[TestClient, Path], url: str, status: int) -> None:
    http, root = runs_client
    write_run(root, "r")
    response = http.get(url)
    assert response.status_code == status, response.text
    assert response.json()["detail"][0]["msg"]


def test_replay_download_upload_delete(runs_client: tuple[TestClient, Path]) -> None:
    http, root = runs_client
    write_run(root, "r")
    replayed = http.post("/api/v1/runs/r/replay", json={"config": {"preset": "trl-dr_grpo"}}).json()
    assert replayed["config"]["aggregation"] == "seq-mean-token-sum-norm"
    assert replayed["config"]["gradient_accumulation_steps"] == 2  # the trainer's scaling is kept
    first = replayed["steps"][0]
    assert first["original"]["loss"] != first["replay"]["loss"]
    assert first["replay"]["loss"] == pytest.approx(
        first["replay"]["policy_loss"] + first["replay"]["kl_loss"], abs=1e-6
    )

    archive = http.get("/api/v1/runs/r/download")
    assert archive.headers["content-type"] == "application/zip"
    names = zipfile.ZipFile(io.BytesIO(archive.content)).namelist()
    assert names[0] == "run.json" and len(names) == 5
    created = http.post("/api/v1/runs", files={"file": ("copy.zip", archive.content)}, data={"name": "copy"})
    assert created.status_code == 201 and created.json()["steps"] == 2
    assert http.get("/api/v1/runs/copy").json()["ok"]
    assert http.post("/api/v1/runs", files={"file": ("copy.zip", archive.content)}).status_code == 409

    assert http.delete("/api/v1/runs/copy").status_code == 204
    assert http.get("/api/v1/runs/copy").status_code == 404
    assert sorted(p.name for p in root.iterdir()) == ["r"]


def zipped(members: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("members", "status", "words"),
    [
        ({"run.json": "{}", "../evil.txt": "x"}, 422, "inside the run"),
        ({"run.json": "{}", "/abs/steps/000001-000.safetensors": "x"}, 422, "inside the run"),
        ({"run.json": "{}", "steps/notes.txt": "x"}, 422, "steps/NNNNNN-NNN"),
        ({"steps/000001-000.safetensors": "x"}, 422, "run.json"),
        ({"run.json": "{nope"}, 422, "valid JSON"),
        ({"run.json": '{"format": 99}'}, 422, "format"),
        ({"run.json": "x" * 300_000}, 413, "bytes"),
    ],
)
def test_hostile_uploads_are_refused(
    runs_client: tuple[TestClient, Path], members: dict[str, Any], status: int, words: str
) -> None:
    http, root = runs_client
    response = http.post("/api/v1/runs", files={"file": ("up.zip", zipped(members))})
    assert response.status_code == status, response.text
    assert words in response.json()["detail"][0]["msg"]
    assert list(root.iterdir()) == []  # nothing half-written is left
    not_zip = http.post("/api/v1/runs", files={"file": ("up.zip", b"plain bytes")})
    assert not_zip.status_code == 422


# /api/v1/runs read its form with FastAPI's UploadFile, /api/v1/upload with its own parser: the same
# broken or oversized form was a 400 in Starlette's words (no field named) on one and a 422 naming the
# body on the other, and a run's form took a thousand fields where a batch's took eight. Now one parser
# (app.forms) reads both, with the same limits and the same errors.
BROKEN_FORMS = {
    "not UTF-8": b'--b\r\nContent-Disposition: form-data; name="name"\r\n\r\n\xff\xfe\r\n--b--\r\n',
    "nine fields": b"".join(b'--b\r\nContent-Disposition: form-data; name="f%d"\r\n\r\nx\r\n' % i for i in range(9))
    + b"--b--\r\n",
    "three files": b"".join(
        b'--b\r\nContent-Disposition: form-data; name="file"; filename="f%d.zip"\r\n\r\nx\r\n' % i for i in range(3)
    )
    + b"--b--\r\n",
}


@pytest.mark.parametrize("form", sorted(BROKEN_FORMS))
@pytest.mark.parametrize("path", ["/api/v1/upload", "/api/v1/runs"])
def test_both_file_routes_refuse_a_broken_form_alike(
    runs_client: tuple[TestClient, Path], path: str, form: str
) -> None:
    http, root = runs_client
    headers = {"content-type": "multipart/form-data; boundary=b"}
    response = http.post(path, content=BROKEN_FORMS[form], headers=headers)
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert detail[0]["loc"] == ["body"] and detail[0]["type"] == "form_invalid", detail
    assert list(root.iterdir()) == []


def test_a_run_form_without_its_file_names_the_file(runs_client: tuple[TestClient, Path]) -> None:
    http, _ = runs_client
    response = http.post("/api/v1/runs", files={"name": (None, "only-a-name")})
    assert response.status_code == 422 and response.json()["detail"][0]["loc"] == ["body", "file"]
    named_file = {"file": ("r.zip", b"x"), "name": ("name.txt", b"a name sent as a file")}
    response = http.post("/api/v1/runs", files=named_file)
    assert response.status_code == 422 and response.json()["detail"][0]["loc"] == ["body", "name"]


def test_logged_lines_travel_with_the_run_and_are_checked_on_upload(runs_client: tuple[TestClient, Path]) -> None:
    """A captured run logs a line per step into logged.jsonl: the download carries it, the upload checks it."""
    http, root = runs_client
    run = write_run(root, "r")
    info = json.loads((run / "run.json").read_text())
    logged = info.pop("logged")
    (run / "run.json").write_text(json.dumps(info))
    lines = [json.dumps({"step": int(step), "metrics": metrics}) for step, metrics in logged.items()]
    (run / "logged.jsonl").write_text("\n".join(lines) + "\n")
    detail = http.get("/api/v1/runs/r").json()
    assert detail["ok"] and [s["logged"] for s in detail["steps"]] == [logged["1"], logged["2"]]
    archive = http.get("/api/v1/runs/r/download").content
    assert "logged.jsonl" in zipfile.ZipFile(io.BytesIO(archive)).namelist()
    assert http.post("/api/v1/runs", files={"file": ("c.zip", archive)}, data={"name": "copy"}).status_code == 201
    assert [s["logged"] for s in http.get("/api/v1/runs/copy").json()["steps"]] == [logged["1"], logged["2"]]
    members = {"run.json": json.dumps(info), "logged.jsonl": '{"step": 1, "metrics": {"kl": "x"}}\n'}
    bad = http.post("/api/v1/runs", files={"file": ("b.zip", zipped(members))}, data={"name": "bad"})
    assert bad.status_code == 422 and "logged.jsonl" in bad.text and "line 1" in bad.text
