"""The hostile catalogue, continued: inputs found after test_hostile.py's classes were closed.

Each test sends one input that once got a 500 (or an answer that named no field) and checks the
answer it gets now. In process (ASGI) throughout: these are the app's and the library's answers.
New classes here: integers past 64 bits that reach a JSON answer (the page's query, a stored run),
a captured run's files as untrusted input (run.json and step files an upload carries), the lab's
errors naming their field, HEAD on the GET routes, and how much of a bad input an error echoes.
"""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from api_fixtures import client, error_detail
from fastapi.testclient import TestClient
from safetensors.torch import save
from test_api_runs import write_run
from test_runs import step_tensors

from app.main import create_app
from app.settings import Settings
from grpo.runs import read_metadata


@pytest.fixture(scope="module")
def api() -> TestClient:
    return client(raise_server_exceptions=False)


@pytest.fixture
def runs(tmp_path: Path) -> Iterator[tuple[TestClient, Path]]:
    # No worker process: the runs here are tiny (thread lane), and one spawned per test costs seconds of imports.
    settings = Settings(runs_dir=str(tmp_path), process_workers=0)
    with TestClient(create_app(settings), raise_server_exceptions=False) as http:
        yield http, tmp_path


def zipped(members: dict[str, str | bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def a_run(root: Path) -> tuple[str, dict[str, str]]:
    """A good run's run.json text and its first step file's metadata (to tamper with)."""
    write_run(root, "model")
    step = (root / "model" / "steps" / "000001-000.safetensors").read_bytes()
    return (root / "model" / "run.json").read_text(), read_metadata(step)


# --- integers past 64 bits that reach a JSON answer -----------------------------------------------------
# The page reads its query like state.js (Number(raw)); a whole number was made a Python int, and
# one past 64 bits (1e30, 1e308, 99999999999999999999999) could not be written into the page's boot
# JSON: GET /?beta=1e30 was a 500. Now the page renders (its first answer left to the API).
@pytest.mark.parametrize("query", ["beta=1e30", "max_completion_length=1e308", "epsilon_low=99999999999999999999999"])
def test_the_page_takes_numbers_past_64_bit_integers_in_its_query(api: TestClient, query: str) -> None:
    response = api.get(f"/?{query}", headers={"accept": "text/html"})
    assert response.status_code == 200, response.text[:300]


# A run.json whose "created" is 10**30 (json.loads reads any integer): GET /api/v1/runs/{run} was a
# 500 (orjson writes at most 64-bit integers). Now the number is answered as a float.
def test_a_stored_run_with_an_integer_past_64_bits_is_answered(runs: tuple[TestClient, Path]) -> None:
    http, root = runs
    info, _ = a_run(root)
    upload = http.post("/api/v1/runs", files={"file": ("u.zip", zipped({"run.json": info}))}, data={"name": "u"})
    assert upload.status_code == 201, upload.text
    run = json.loads((root / "u" / "run.json").read_text())
    (root / "u" / "run.json").write_text(json.dumps({**run, "created": 10**30}))
    response = http.get("/api/v1/runs/u")
    assert response.status_code == 200, response.text
    assert response.json()["created"] == 1e30


# --- a run's files are input: run.json -------------------------------------------------------------------
# An uploaded zip whose run.json is valid JSON but not an object (a list, null, a number), or is
# nested 100 000 deep: POST /api/v1/runs was a 500 (info.get on a list; RecursionError from
# json.loads). Now a 422 at the run.json that says an object of a run was expected.
@pytest.mark.parametrize("text", ["[]", "null", "3", "[" * 100_000], ids=["list", "null", "number", "deep"])
def test_a_run_json_that_is_not_an_object_is_a_422(runs: tuple[TestClient, Path], text: str) -> None:
    http, root = runs
    response = http.post("/api/v1/runs", files={"file": ("u.zip", zipped({"run.json": text}))}, data={"name": "u"})
    detail = error_detail(response, 422)
    assert detail[0]["loc"][-1] == "run.json" and "run" in detail[0]["msg"], detail
    assert not (root / "u").exists()


# --- a run's files are input: step files ------------------------------------------------------------------
# A zipped run whose step file the library cannot read (group_size a vector, rank not a number,
# config or meta JSON nested 100 000 deep, no per_token_logps, a header of garbage) was accepted
# by POST /api/v1/runs, and then every view of the run was a 500 (the run's page, the step, replay).
# Now the upload is a 422 that names the step file and what was wrong, and nothing is kept.
def _step(root: Path, change: str) -> bytes:
    _, meta = a_run(root)
    tensors: dict[str, torch.Tensor] = step_tensors(1)
    if change == "group_size-vector":
        tensors["group_size"] = torch.tensor([2, 2])
    elif change == "no-per_token_logps":
        del tensors["per_token_logps"]
    elif change == "rank-not-a-number":
        meta["rank"] = "x"
    elif change == "config-deep":
        meta["config"] = "[" * 100_000
    elif change == "meta-deep":
        meta["meta"] = "[" * 100_000
    elif change == "garbage":
        return b"garbage"
    return save(tensors, metadata=meta)


@pytest.mark.parametrize(
    "change",
    ["group_size-vector", "no-per_token_logps", "rank-not-a-number", "config-deep", "meta-deep", "garbage"],
)
def test_an_unreadable_step_file_is_refused_at_upload(runs: tuple[TestClient, Path], change: str) -> None:
    http, root = runs
    info, _ = a_run(root)
    members = {"run.json": info, "steps/000001-000.safetensors": _step(root, change)}
    response = http.post("/api/v1/runs", files={"file": ("u.zip", zipped(members))}, data={"name": "u"})
    detail = error_detail(response, 422)
    assert "000001-000.safetensors" in detail[0]["msg"], detail
    assert not (root / "u").exists()


# The same step files put in the runs directory by another hand (a capture, a copy): the run's
# views were 500s; now each view of the step is a 422 naming the step file, and the run's page (the check of
# every file) answers with that file's verdict "error" and why (the verdict: it was a 422 for the whole run).
@pytest.mark.parametrize("change", ["group_size-vector", "no-per_token_logps", "rank-not-a-number", "meta-deep"])
def test_an_unreadable_step_file_on_disk_is_a_422_on_every_view(runs: tuple[TestClient, Path], change: str) -> None:
    http, root = runs
    data = _step(root, change)
    (root / "model" / "steps" / "000001-000.safetensors").write_bytes(data)
    page = http.get("/api/v1/runs/model")
    assert page.status_code == 200 and page.json()["verdict"] == "error", page.text[:500]
    (failed,) = [e for s in page.json()["steps"] for e in s["errors"]]
    assert failed["file"] == "000001-000.safetensors" and failed["error"]
    for response in (
        http.get("/api/v1/runs/model/steps/1"),
        http.post("/api/v1/runs/model/replay", json={"beta": 0.1}),
        http.get("/api/v1/lab/runs/model/steps/1"),
    ):
        detail = error_detail(response, 422)
        assert "000001-000.safetensors" in detail[0]["msg"], (response.url, detail)


# A step whose meta holds "metrics" as a list (a trainer's log is free-form): GET /api/v1/runs/{run}
# was a 500 (.items() on a list). Now the logged metrics that are not an object are not compared.
def test_a_step_whose_logged_metrics_are_not_an_object_is_answered(runs: tuple[TestClient, Path]) -> None:
    http, root = runs
    _, meta = a_run(root)
    path = root / "model" / "steps" / "000001-000.safetensors"
    path.write_bytes(save(step_tensors(1), metadata={**meta, "meta": json.dumps({"loss": 0.5, "metrics": [1]})}))
    assert http.get("/api/v1/runs/model").status_code == 200
    meta_list = {**meta, "meta": "[1, 2]"}  # the lab's step route read meta.get("tokens")
    path.write_bytes(save(step_tensors(1), metadata=meta_list))
    assert http.get("/api/v1/lab/runs/model/steps/1").status_code == 200


# A step that holds rewards and no advantages (the library computes them): GET /api/v1/runs/{run}
# answered, but the step's view was a 500 (an assert on advantages) and so was the lab's step route.
# Now both answer, with the advantages the loss computed from the rewards.
def test_a_step_with_rewards_and_no_advantages_is_answered(runs: tuple[TestClient, Path]) -> None:
    http, root = runs
    _, meta = a_run(root)
    tensors = step_tensors(1)
    del tensors["advantages"]
    tensors["rewards"] = torch.tensor([1.0, 0.0, 1.0, 0.0])
    (root / "model" / "steps" / "000001-000.safetensors").write_bytes(save(tensors, metadata=meta))
    step = http.get("/api/v1/runs/model/steps/1", params={"micro": 0})
    assert step.status_code == 200, step.text
    assert len(step.json()["request"]["advantages"]) == 4
    lab = http.get("/api/v1/lab/runs/model/steps/1")
    assert lab.status_code == 200, lab.text
    assert len(lab.json()["request"]["advantages"]) == 4


# --- the lab's errors name their field ----------------------------------------------------------------------
# The lab's 404, 409 and 429 were HTTPException strings: their loc was [] (no field named). Now the
# loc names the path parameter or the body field, as /api/v1/runs does.
def test_lab_errors_name_the_field(runs: tuple[TestClient, Path]) -> None:
    http, root = runs
    write_run(root, "taken")
    assert error_detail(http.get("/api/v1/lab/runs/nope/status"), 404)[0]["loc"] == ["path", "run_id"]
    assert error_detail(http.delete("/api/v1/lab/runs/nope"), 404)[0]["loc"] == ["path", "run_id"]
    assert error_detail(http.get("/api/v1/lab/runs/nope/events"), 404)[0]["loc"] == ["path", "run_id"]
    assert error_detail(http.get("/api/v1/lab/runs/taken/steps/9"), 404)[0]["loc"] == ["path", "step"]
    assert error_detail(http.get("/api/v1/lab/runs/..x/steps/1"), 404)[0]["loc"] == ["path", "run_id"]
    taken = error_detail(http.post("/api/v1/lab/runs", json={"name": "taken", "steps": 1}), 409)
    assert taken[0]["loc"] == ["body", "name"], taken


# --- HEAD on the GET routes -----------------------------------------------------------------------------------
# HTTP has every GET resource answer HEAD (uptime checks and `curl -I` send it); the app answered
# 405 Allow: GET on every route it defines (/healthz, /, the API's GETs). Now HEAD answers as GET
# would, without a body, with the security headers.
@pytest.mark.parametrize("path", ["/healthz", "/", "/api/v1/options", "/api/v1/examples/json", "/api/v1/runs"])
def test_head_answers_where_get_does(api: TestClient, path: str) -> None:
    response = api.head(path)
    assert response.status_code == 200, (path, response.status_code, response.headers)
    assert response.content == b"" and response.headers["x-content-type-options"] == "nosniff"


# --- how much of a bad input an error echoes -------------------------------------------------------------------
# A file part without a filename (or a form field where a file belongs) reached FastAPI's own
# validation, whose error carried the whole value as "input": up to 1 MiB of the client's bytes
# echoed back. Now a string input in an error is cut to a short prefix.
def test_an_error_echoes_at_most_a_short_prefix_of_what_was_sent(runs: tuple[TestClient, Path]) -> None:
    http, _ = runs
    response = http.post("/api/v1/runs", data={"file": "A" * 500_000})
    detail = error_detail(response, 422)
    assert detail[0]["loc"] == ["body", "file"]
    assert len(response.content) < 2_000, len(response.content)


# --- 405s name what the address takes -------------------------------------------------------------------------
# The 405 handler listed the methods the OpenAPI document holds at the path: the pages and the
# static files are not in it, so POST / or POST /static/css/app.css answered an empty Allow header,
# and every 405 said only "Method Not Allowed". Now Allow lists the route's methods and the
# message says which were expected.
@pytest.mark.parametrize(("path", "allowed"), [("/", "GET, HEAD"), ("/static/css/app.css", "GET, HEAD")])
def test_a_405_names_the_methods_the_address_takes(api: TestClient, path: str, allowed: str) -> None:
    response = api.post(path)
    detail = error_detail(response, 405)
    assert response.headers["allow"] == allowed
    assert allowed in detail[0]["msg"], detail
