"""A variant added from outside GRPO Lens is seen everywhere, with no other edit.

In a fresh process (so no other test sees a changed registry), GRPO_LENS_PLUGINS names a toy
module that registers one objective and one preset. That process reports what LossConfig,
evaluate, /api/v1/options (the page builds its objective select and axis title from it) and the
README-table check see; this test checks the report.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

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


CHROMIUM = "/usr/bin/chromium"


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed (make test installs it)")
def test_the_page_offers_the_toy_objective_and_draws_its_axis(tmp_path: Path) -> None:
    """The same plugin in a real server and headless Chromium: the objective control lists it, the
    toy preset selects it, and the clip view's y axis is the entry's axis title."""
    playwright = pytest.importorskip("playwright.sync_api")
    (tmp_path / "toy_objective.py").write_text(TOY, encoding="utf-8")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    env = {
        **os.environ,
        "GRPO_LENS_PLUGINS": "toy_objective",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
    }
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
        with playwright.sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=CHROMIUM,
                args=["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"],
            )
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
    finally:
        server.terminate()
        server.wait(10)
