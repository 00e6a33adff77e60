"""``python -m grpo eval FILE [--preset NAME] [--json]``: the API's numbers from a shell.

Most cases call ``grpo.__main__.main`` in this process; one runs the real ``python -m grpo``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from api_fixtures import ROOT, client, ragged_body
from safetensors.torch import save as save_safetensors

import grpo
from grpo.__main__ import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def api_loss(body: dict[str, Any]) -> dict[str, Any]:
    response = client().post("/api/v1/loss", json=body)
    assert response.status_code == 200
    result: dict[str, Any] = response.json()
    return result


@pytest.fixture
def batch_file(tmp_path: Path) -> Path:
    path = tmp_path / "batch.json"
    path.write_text(json.dumps({**ragged_body(1), "config": {"preset": "verl-grpo", "beta": 0.1}}))
    return path


def test_eval_json_is_the_apis_response(capsys: pytest.CaptureFixture[str], batch_file: Path) -> None:
    code, out, err = run(capsys, "eval", str(batch_file), "--json")
    assert code == 0, err
    assert json.loads(out) == api_loss(json.loads(batch_file.read_text()))


def test_preset_flag_overrides_the_files_preset(capsys: pytest.CaptureFixture[str], batch_file: Path) -> None:
    code, out, _ = run(capsys, "eval", str(batch_file), "--preset", "trl-dapo", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["config"]["preset"] == "trl-dapo"
    assert data["config"]["beta"] == 0.1  # the file's overrides still apply
    body = {**json.loads(batch_file.read_text()), "config": {"preset": "trl-dapo", "beta": 0.1}}
    assert data["loss"] == api_loss(body)["loss"]


def test_set_overrides_a_field(capsys: pytest.CaptureFixture[str], batch_file: Path) -> None:
    code, out, _ = run(capsys, "eval", str(batch_file), "--set", "beta=0.5", "--set", "kl_estimator=k2", "--json")
    assert code == 0
    config = json.loads(out)["config"]
    assert (config["beta"], config["kl_estimator"]) == (0.5, "k2")


def test_table_output_names_the_loss(capsys: pytest.CaptureFixture[str], batch_file: Path) -> None:
    code, out, _ = run(capsys, "eval", str(batch_file))
    assert code == 0
    loss = api_loss(json.loads(batch_file.read_text()))["loss"]
    assert "loss" in out and f"{loss:.6g}"[:5] in out


def test_eval_reads_tensor_files(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    tensors = {"per_token_logps": -torch.rand(3, 4, dtype=torch.float64) - 0.01, "rewards": torch.tensor([1.0, 0, 2])}
    path = tmp_path / "batch.safetensors"
    path.write_bytes(save_safetensors(tensors))
    code, out, _ = run(capsys, "eval", str(path), "--json")
    assert code == 0
    body = {"per_token_logps": tensors["per_token_logps"].tolist(), "rewards": [1.0, 0.0, 2.0]}
    assert json.loads(out) == api_loss(body)


def test_no_arguments_shows_the_article_example(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys)
    assert code == 0
    assert "article" in out and "loss" in out


@pytest.mark.parametrize(
    ("args", "content", "words"),
    [
        (["--preset", "nope"], None, ["preset", *grpo.PRESETS]),
        (["--set", "beta=-1"], None, ["beta", ">= 0"]),
        (["--set", "epsilon=0.2"], None, ["LossConfig field"]),
        ([], '{"per_token_logps": [[0.5]], "rewards": [1]}', ["per_token_logps[0]", "<= 0"]),
        ([], '{"per_token_logps": [[-1, -2]], "old_per_token_logps": [[-1]], "rewards": [1]}', ["old_per_token_logps"]),
        ([], "{not json", ["valid JSON"]),
    ],
)
def test_bad_input_exits_2_with_a_message(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    batch_file: Path,
    args: list[str],
    content: Any,
    words: list[str],
) -> None:
    path = batch_file
    if content is not None:
        path = tmp_path / "bad.json"
        path.write_text(content)
    code, out, err = run(capsys, "eval", str(path), *args)
    assert code == 2 and out == ""
    assert err.startswith("error: ") and "Traceback" not in err
    assert all(word in err for word in words), err


def test_a_missing_file_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "eval", str(tmp_path / "none.json"))
    assert code == 2 and "No such file" in err


def test_a_file_without_rows_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "empty.json"
    path.write_text('{"rewards": [1]}')
    assert run(capsys, "eval", str(path))[0] == 2


def test_a_config_that_is_not_an_object_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "cfg.json"
    path.write_text('{"per_token_logps": [[-1]], "rewards": [1], "config": [1]}')
    assert run(capsys, "eval", str(path))[0] == 2


def test_python_dash_m_grpo_eval(batch_file: Path) -> None:
    """The real entry point, in a fresh interpreter."""
    done = subprocess.run(
        [sys.executable, "-m", "grpo", "eval", str(batch_file), "--preset", "article", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    body = {**json.loads(batch_file.read_text()), "config": {"preset": "article", "beta": 0.1}}
    assert json.loads(done.stdout)["loss"] == api_loss(body)["loss"]
    failed = subprocess.run(
        [sys.executable, "-m", "grpo", "eval", str(batch_file), "--preset", "nope"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert failed.returncode == 2 and failed.stderr.startswith("error: preset")
