"""A variant, a file format and a batch field added from outside GRPO Lens are seen everywhere, with no
other edit.

In a fresh process (so no other test sees a changed registry), GRPO_LENS_PLUGINS names a toy
module that registers one objective and one preset. That process reports what LossConfig,
evaluate, /api/v1/options (the page builds its objective select and axis title from it) and the
README-table check see; this test checks the report. A second toy module registers an upload format
and a batch field (docs/extending.md's recipes): the API, the CLI and the page offer them.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

TOY = '''
"""A toy objective and its preset, registered from outside GRPO Lens."""
import grpo
from grpo.objectives import OBJECTIVES, ObjectiveTerms, regions


@OBJECTIVES.register("toy", label="Toy", axis="toy objective / |A|")
def toy(ratio, logp, advantages, settings):
    """Toy: 2·r·A, twice the unclipped surrogate; nothing is ever flat.

    Paper: https://example.org/toy
    """
    surrogate = 2 * ratio * advantages
    return ObjectiveTerms(surrogate, ratio.detach().expand_as(surrogate), regions(surrogate.detach()))


grpo.register_preset(
    grpo.Preset("toy-preset", "The toy objective, token mean, no KL.", "tests/test_plugins.py",
                {"objective": "toy", "aggregation": "token-mean", "beta": 0.0})
)
'''

REPORT = """
import contextlib
import json
from fastapi.testclient import TestClient
import grpo
import app.main
from readme_check import README, missing_rows
from reference import HAND

application = app.main.create_app() if hasattr(app.main, "create_app") else app.main.app
options = TestClient(application).get("/api/v1/options").json()
fields = {f["name"]: f for f in options["fields"]}
bd = grpo.evaluate(grpo.Batch(**HAND), grpo.LossConfig.from_preset("toy-preset", dtype="float64"))
print(json.dumps({
    "plugins": grpo.load_plugins(),
    "config": grpo.LossConfig(objective="toy").objective,
    "loss": float(bd.loss),
    "grad": bd.tokens.grad.tolist(),
    "warnings": list(bd.warnings),
    "objective_choices": fields["objective"]["choices"],
    "objective_entries": {e["name"]: e for e in options["registries"]["objective"]},
    "presets": [p["name"] for p in options["presets"]],
    "readme_missing": missing_rows(README.read_text(encoding="utf-8"), grpo.REGISTRIES, grpo.PRESETS),
}))
"""


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    plugins = tmp_path_factory.mktemp("plugins")
    (plugins / "toy_objective.py").write_text(TOY, encoding="utf-8")
    path = os.pathsep.join([str(plugins), str(TESTS), str(ROOT)])
    env = {**os.environ, "GRPO_LENS_PLUGINS": "toy_objective", "PYTHONPATH": path}
    done = subprocess.run(
        [sys.executable, "-c", REPORT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_the_plugin_is_loaded_and_accepted_by_loss_config(report: dict[str, object]) -> None:
    assert report["plugins"] == ["toy_objective"]
    assert report["config"] == "toy"


def test_evaluate_computes_the_toy_loss_by_hand(report: dict[str, object]) -> None:
    # reference.HAND: ratios [[1.5, 0.9], [0.5, 1.1, 4.0]], A = [+1, -1]. Surrogate 2rA per token:
    # 3.0, 1.8 | -1.0, -2.2, -8.0, sum -6.4; token mean over 5 tokens, loss = 6.4 / 5 = 1.28.
    # d loss / d logp = -2·r·A / 5 (d r / d logp = r), 0 at the padding.
    assert report["loss"] == pytest.approx(1.28, rel=1e-12)
    expected = [[-0.6, -0.36, 0.0], [0.2, 0.44, 1.6]]
    for row, want in zip(report["grad"], expected, strict=True):  # type: ignore[call-overload]
        assert row == pytest.approx(want, rel=1e-12, abs=1e-15)
    assert not any("objective" in w for w in report["warnings"])  # type: ignore[attr-defined]


def test_the_options_the_page_builds_its_controls_from_offer_it(report: dict[str, object]) -> None:
    assert "toy" in report["objective_choices"]  # type: ignore[operator]
    toy = report["objective_entries"]["toy"]  # type: ignore[index]
    assert toy["label"] == "Toy" and toy["axis"] == "toy objective / |A|"
    assert toy["doc"].startswith("Toy: 2·r·A") and toy["paper"] == "https://example.org/toy"
    assert "toy-preset" in report["presets"]  # type: ignore[operator]


def test_the_readme_check_reports_exactly_the_toy_entries_as_undocumented(report: dict[str, object]) -> None:
    """The README is the project's, not the plugin's: the check sees the two new entries and says
    they are missing from its tables (and nothing else is)."""
    assert report["readme_missing"] == ["objective:toy", "preset:toy-preset"]


TOY_FORMAT = '''
"""A toy text format and a toy per-token field, registered from outside GRPO Lens."""
import grpo
from grpo.errors import GrpoInputError
from grpo.export import padded_arrays, row_lengths
from grpo.fields import ragged


def read_toy(data, max_bytes):
    """'TOY1', then one line per row: its reward, '|', its log-probs."""
    lines = data.decode("utf-8").split("\\n")
    rows = [line.split("|") for line in lines[1:] if line.strip()]
    logps = [[float(x) for x in lp.split()] for _, lp in rows]
    return {"rewards": [float(r) for r, _ in rows], "per_token_logps": logps}


def write_toy(fields, lengths=None):
    if fields.get("rewards") is None:
        raise GrpoInputError("rewards", "rewards (a toy file holds no advantages)")
    lengths = row_lengths(fields, lengths)
    rows = ragged(padded_arrays(fields, lengths)["per_token_logps"], lengths)
    lines = [f"{r!r}|{' '.join(repr(float(x)) for x in row)}" for r, row in zip(fields["rewards"], rows)]
    return ("TOY1\\n" + "\\n".join(lines) + "\\n").encode()


grpo.register_format(grpo.UploadFormat(
    "toy", "Toy text", ("toyb",), "toy", read_toy, write_toy, "text/x-toy",
    sniffer=lambda data: data[:4] == b"TOY1", content_doc="a toy text file",
))
grpo.register_field(grpo.BatchField(
    "toy_scores", "token", "float", "Toy per-token scores in [0, 1]; NaN where not scored.",
    aliases=("toy_score",), low=0.0, high=1.0, nan_ok=True,
))
'''

# A hand-made batch in the toy format: rewards 1 and 0, rows of 2 and 1 tokens.
TOY_FILE = b"TOY1\n1.0|-1.0 -0.5\n0.0|-2.0\n"
TOY_JSON = {"per_token_logps": [[-1.0, -0.5], [-2.0]], "rewards": [1.0, 0.0]}

FORMAT_REPORT = """
import json, math
from fastapi.testclient import TestClient
import grpo
import app.main
from grpo.requests import batch_from_request
from test_plugins import TOY_FILE, TOY_JSON

client = TestClient(app.main.app)
options = client.get("/api/v1/options").json()
def summary(answer):  # the loss and every token's gradient (the loss alone is 0 here: ratio 1, A sums to 0)
    return [answer.get("loss"), answer.get("tokens", {}).get("grad")]

loss = summary(client.post("/api/v1/loss", json=TOY_JSON).json())
upload = client.post("/api/v1/upload", files={"file": ("batch.toyb", TOY_FILE)})
exported = client.post("/api/v1/export/toy", json=TOY_JSON)
# The field: NaN ("not scored") accepted under its alias, a value past its bound refused with its row and position.
scored = client.post("/api/v1/loss", content=json.dumps({**TOY_JSON, "toy_score": [[0.5, float("nan")], [1.0]]}))
bad = client.post("/api/v1/loss", json={**TOY_JSON, "toy_scores": [[0.5, 1.5], [1.0]]})
batch = batch_from_request({**TOY_JSON, "toy_scores": [[0.5, float("nan")], [1.0]]})
try:
    batch_from_request({**TOY_JSON, "toy_scores": [[0.5], [1.0]]})
    short = ""
except grpo.GrpoInputError as exc:
    short = str(exc)
print(json.dumps({
    "formats": options["formats"],
    "batch_fields": [f["name"] for f in options["batch_fields"]],
    "loss": loss,
    "upload": [upload.status_code, summary(upload.json())],
    "export": [exported.status_code, exported.headers["content-type"], exported.content.decode()],
    "scored": [scored.status_code, summary(scored.json())],
    "bad": [bad.status_code, bad.json()["detail"]],
    "extra": [[None if math.isnan(v) else v for v in row] for row in batch.extra["toy_scores"].tolist()],
    "short": short,
}))
"""


def _toy_env(plugins: Path) -> dict[str, str]:
    (plugins / "toy_format.py").write_text(TOY_FORMAT, encoding="utf-8")
    path = os.pathsep.join([str(plugins), str(TESTS), str(ROOT)])
    return {**os.environ, "GRPO_LENS_PLUGINS": "toy_format", "PYTHONPATH": path}


@pytest.fixture(scope="module")
def toy_report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    env = _toy_env(tmp_path_factory.mktemp("toy_format"))
    done = subprocess.run(
        [sys.executable, "-c", FORMAT_REPORT],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_the_options_offer_the_toy_format_and_field(toy_report: dict[str, Any]) -> None:
    toy = toy_report["formats"]["upload"][-1]
    assert toy == {"name": "toy", "label": "Toy text", "extensions": [".toyb"], "export": True}
    assert toy_report["formats"]["accept"].endswith(",.toyb")
    assert toy_report["batch_fields"][-1] == "toy_scores"


def test_a_toy_file_uploads_and_exports_as_the_same_batch(toy_report: dict[str, Any]) -> None:
    """The upload reads the toy file as the JSON batch it holds (same loss and gradients); the export
    writes it back byte for byte."""
    # rewards 1, 0 in one group: A = +-0.7071 (std 0.7071 unbiased); seq-mean-token-mean, ratio 1:
    # d loss / d logp = -A_i / (2 * len_i): -0.1768 on row 0's two tokens, +0.3536 on row 1's one.
    grad = toy_report["loss"][1]
    assert grad[0] == pytest.approx([-0.1767767, -0.1767767], abs=1e-5) and grad[1] == pytest.approx(
        [0.3535534], abs=1e-5
    )
    assert toy_report["upload"] == [200, toy_report["loss"]]
    status, media, text = toy_report["export"]
    assert status == 200 and media.startswith("text/x-toy")
    assert text == TOY_FILE.decode()


def test_the_toy_field_is_checked_by_its_table_entry(toy_report: dict[str, Any]) -> None:
    """NaN is allowed (the entry says so) and kept at a counted token, padding zeroed; 1.5 is past the
    entry's bound of 1 and refused naming the field, the row and the position; a short row is named too."""
    assert toy_report["scored"] == [200, toy_report["loss"]]  # the field is accepted, and takes no part in the loss
    assert toy_report["extra"] == [[0.5, None], [1.0, 0.0]]
    (error,) = toy_report["bad"][1]
    assert toy_report["bad"][0] == 422 and error["loc"] == ["body", "toy_scores", 0, 1]
    assert "less than or equal to 1" in error["msg"]
    assert toy_report["short"] == "toy_scores[0]: expected 2 values like per_token_logps[0], got 1"


def test_the_cli_evaluates_a_toy_file(tmp_path: Path, toy_report: dict[str, Any]) -> None:
    env = _toy_env(tmp_path)
    (tmp_path / "batch.toyb").write_bytes(TOY_FILE)
    cmd = [sys.executable, "-m", "grpo", "eval", str(tmp_path / "batch.toyb"), "--json"]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert [answer["loss"], answer["tokens"]["grad"]] == toy_report["loss"]
    helped = subprocess.run(
        [sys.executable, "-m", "grpo", "--help"], cwd=ROOT, env=env, capture_output=True, text=True, check=False
    )
    assert "Toy text" in helped.stdout


CHROMIUM = "/usr/bin/chromium"


def _browser(p: Any) -> Any:
    return p.chromium.launch(
        executable_path=CHROMIUM,
        args=["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"],
    )


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed (make test installs it)")
def test_the_page_offers_the_toy_format_and_field(tmp_path: Path) -> None:
    """The toy format's plugin in a real server and headless Chromium: the upload's label names it, the
    file input accepts its extension, its example and export are offered, the upload help lists the
    toy field, and uploading a toy file draws its batch."""
    playwright = pytest.importorskip("playwright.sync_api")
    env = _toy_env(tmp_path)
    (tmp_path / "batch.toyb").write_bytes(TOY_FILE)
    with _server(env) as url, playwright.sync_playwright() as p:
        browser = _browser(p)
        page = browser.new_page()
        page.goto(f"{url}/")
        page.wait_for_function("document.getElementById('upload-label').textContent.includes('Toy text')")
        page.click("#tab-upload")
        assert page.inner_text("#upload-label").startswith(
            "A batch file: JSON, JSONL, safetensors, NPZ, .pt or Toy text"
        )
        assert page.get_attribute("#upload-file", "accept").split(",")[-1] == ".toyb"
        assert "toy_scores" in page.inner_text("#upload-help")
        assert "also toy_score" in page.inner_text("#upload-help")
        links = page.evaluate("[...document.querySelectorAll('#upload-help a')].map(a => a.getAttribute('href'))")
        assert links[-1] == "/api/v1/examples/toy"
        assert page.inner_text("#export-toy") == ".toyb"
        page.set_input_files("#upload-file", str(tmp_path / "batch.toyb"))
        page.wait_for_function("document.getElementById('upload-info').textContent.includes('batch.toyb')")
        assert page.inner_text("#upload-error") == ""
        browser.close()


@contextlib.contextmanager
def _server(env: dict[str, str]) -> Iterator[str]:
    """uvicorn on a free 127.0.0.1 port with ``env`` (the plugins): its URL once /healthz answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    cmd = [sys.executable, "-m", "uvicorn", "app.main:app", "--host", "127.0.0.1", "--port", str(port)]
    server = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(f"{url}/healthz", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        yield url
    finally:
        server.terminate()
        server.wait(10)


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed (make test installs it)")
def test_the_page_offers_the_toy_objective_and_draws_its_axis(tmp_path: Path) -> None:
    """The same plugin in a real server and headless Chromium: the objective control lists it, the
    toy preset selects it, and the clip view's y axis is the entry's axis title."""
    playwright = pytest.importorskip("playwright.sync_api")
    (tmp_path / "toy_objective.py").write_text(TOY, encoding="utf-8")
    env = {
        **os.environ,
        "GRPO_LENS_PLUGINS": "toy_objective",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
    }
    with _server(env) as url, playwright.sync_playwright() as p:
        browser = _browser(p)
        page = browser.new_page()
        page.goto(f"{url}/?preset=toy-preset")
        axis = "document.getElementById('clip-curves')?.layout?.yaxis?.title?.text"
        deadline = time.monotonic() + 30
        while page.evaluate(axis) != "toy objective / |A|" and time.monotonic() < deadline:
            time.sleep(0.1)
        choices = page.evaluate("[...document.querySelectorAll('#cfg-objective option')].map((o) => o.value)")
        assert "toy" in choices
        assert page.evaluate("document.getElementById('cfg-objective').value") == "toy"
        assert page.evaluate(axis) == "toy objective / |A|"
        browser.close()
