"""A plugin's objective setting and correction mode among the page's controls, in Chromium.

The plugin of tests/test_plugin_settings.py (a scaled objective with its own ``toy_scale`` and a halving
correction mode) is loaded by a real server through GRPO_LENS_PLUGINS. The page draws ``toy_scale`` from
/api/v1/options beside the built-in settings and offers the mode; typing a scale changes the loss shown, and
that loss is the library's for the request the page sent (computed in a process with the same plugin).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from api_fixtures import serve
from test_plugin_settings import ROOT, _env

CHROMIUM = "/usr/bin/chromium"
SHOTS = Path("/tmp/shots_reg")
LIBRARY = """
import json, sys
import grpo
from grpo.requests import batch_from_request
body = json.load(sys.stdin)
bd = grpo.evaluate(batch_from_request(body), grpo.LossConfig.resolve(body["config"]))
print(json.dumps(float(bd.loss)))
"""


def _library_loss(body: dict[str, Any], env: dict[str, str]) -> float:
    done = subprocess.run(
        [sys.executable, "-c", LIBRARY],
        input=json.dumps(body),
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    loss: float = json.loads(done.stdout)
    return loss


def _sent_scale(response: Any, scale: float) -> bool:
    if "/api/v1/loss" not in response.url or response.request.method != "POST":
        return False
    return bool(response.request.post_data_json.get("config", {}).get("toy_scale") == scale)


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed (make test installs it)")
def test_the_plugins_setting_is_a_control_and_moves_the_loss(tmp_path: Path) -> None:
    playwright = pytest.importorskip("playwright.sync_api")
    env = _env(tmp_path)
    SHOTS.mkdir(exist_ok=True)
    with serve({**env, "GRPO_LENS_PROCESS_WORKERS": "0"}) as url, playwright.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"],
        )
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{url}/")
        page.wait_for_selector("#cfg-toy_scale")
        assert page.get_attribute("label[for='cfg-toy_scale']", "title") == (
            "The scaled objective's s: each token's term is s·r·A."
        )
        modes = page.evaluate("[...document.querySelectorAll('#cfg-rollout_correction option')].map((o) => o.value)")
        assert modes[-1] == "token_halve"
        with page.expect_response(lambda r: "/api/v1/loss" in r.url and r.request.method == "POST") as first:
            page.select_option("#cfg-objective", "scaled")
        assert first.value.ok
        assert page.input_value("#cfg-toy_scale") == "2"  # the declared default, as the answer's config says
        before = page.inner_text("#summary-cards")
        with page.expect_response(lambda r: _sent_scale(r, 3)) as moved:
            page.fill("#cfg-toy_scale", "3")
        answer, body = moved.value.json(), moved.value.request.post_data_json
        assert answer["config"]["toy_scale"] == 3.0
        assert answer["loss"] == _library_loss(body, env)  # the same float32 computation on the same machine
        shown = f"{answer['loss']:.5g}"[:6]
        page.wait_for_function(
            "(text) => document.getElementById('summary-cards').innerText.includes(text)", arg=shown, timeout=15000
        )
        assert page.inner_text("#summary-cards") != before
        assert page.inner_text("#cfg-toy_scale-maps") == "TRL: toy_scale"  # the declared trainer name, shown
        control = page.locator("#cfg-toy_scale >> xpath=..")
        control.scroll_into_view_if_needed()
        control.screenshot(path=str(SHOTS / "plugin_setting_control.png"))
        page.screenshot(path=str(SHOTS / "plugin_setting.png"))
        browser.close()
