"""The sampler's log-probs (``sampling_per_token_logps``) as a batch field, through every reader.

One entry of grpo/fields.py (aliases ``rollout_log_probs``, verl's, and ``generation_logprobs``, NeMo RL's;
bound log-prob <= 0; NaN - JSON null - allowed in this field only, "not scored"). The Python Batch, the
JSON API, each upload format and a run step file read it under every name; a sampler log-prob > 0, and a
NaN anywhere else, is a 4xx naming the field, the row and the position.
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from api_fixtures import client

import grpo
from grpo.fields import BATCH_FIELDS
from grpo.io import load_file
from grpo.requests import batch_from_request
from grpo.runs import RunWriter, load_step

NAMES = ["sampling_per_token_logps", "rollout_log_probs", "generation_logprobs"]
NAN = float("nan")
ROWS = [[-1.0, -2.0, -0.5], [-0.25]]
SAMPLER = [[-1.1, NAN, -0.4], [-0.3]]  # the sampler did not score row 0's second token
BASE: dict[str, Any] = {"per_token_logps": ROWS, "old_per_token_logps": ROWS, "rewards": [1.0, 0.0]}


def expected_grid() -> torch.Tensor:
    """The padded (2, 3) sampler grid a Batch holds: NaN kept where unscored, 0 past each row's end."""
    return torch.tensor([[-1.1, NAN, -0.4], [-0.3, 0.0, 0.0]], dtype=torch.float64)


def same(actual: torch.Tensor | None, expected: torch.Tensor) -> None:
    assert actual is not None
    torch.testing.assert_close(actual.double(), expected, equal_nan=True, rtol=0, atol=1e-7)


def test_the_table_entry() -> None:
    field = BATCH_FIELDS["sampling_per_token_logps"]
    assert field.aliases == ("rollout_log_probs", "generation_logprobs")
    assert field.shape == "token" and field.high == 0.0 and field.nan_ok
    assert [name for name, f in BATCH_FIELDS.items() if f.nan_ok] == ["sampling_per_token_logps"]


@pytest.mark.parametrize("name", NAMES)
def test_python_batch_takes_every_name(name: str) -> None:
    batch = grpo.from_rows(ROWS, rewards=[1.0, 0.0], **{name: SAMPLER})
    same(batch.sampling_per_token_logps, expected_grid())
    padded = torch.tensor([[-1.1, NAN, -0.4], [-0.3, NAN, 5.0]])  # garbage in the padding is zeroed
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    batch = grpo.Batch(
        torch.tensor([[-1.0, -2.0, -0.5], [-0.25, 0, 0]]), completion_mask=mask, advantages=[1, 0], **{name: padded}
    )
    same(batch.sampling_per_token_logps, expected_grid())
    assert batch.extra == {}


def test_without_it_nothing_changes() -> None:
    batch = grpo.from_rows(ROWS, rewards=[1.0, 0.0])
    assert batch.sampling_per_token_logps is None


def test_a_name_and_its_alias_together_are_refused() -> None:
    with pytest.raises(grpo.GrpoInputError, match="rollout_log_probs: expected one of sampling_per_token_logps"):
        grpo.Batch([[-1.0]], advantages=[1.0], sampling_per_token_logps=[[-1.0]], rollout_log_probs=[[-1.0]])


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"sampling_per_token_logps": [[-1.0, -2.0, -0.5], [0.25]]},
            "sampling_per_token_logps[1]: expected log-probs <= 0 (a positive value usually means logits were "
            "passed), got 0.25 at position 0",
        ),
        (
            {"old_per_token_logps": [[-1.0, NAN, -0.5], [-0.25]]},
            "old_per_token_logps[0]: expected finite numbers at every counted token, got nan at position 1",
        ),
        (
            {"sampling_per_token_logps": [[-1.0, -2.0, math.inf], [-0.25]]},
            "sampling_per_token_logps[0]: expected finite numbers at every counted token, got inf at position 2",
        ),
    ],
)
def test_python_errors_name_field_row_position(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(grpo.GrpoInputError) as caught:
        grpo.from_rows(ROWS, rewards=[1.0, 0.0], **fields)
    assert str(caught.value) == message


# --- the API --------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_api_takes_every_name_and_null(name: str) -> None:
    sampler = [[-1.1, None, -0.4], [-0.3]]
    with_it = client().post("/api/v1/loss", json={**BASE, name: sampler, "config": {"dtype": "float64"}})
    assert with_it.status_code == 200, with_it.text
    without = client().post("/api/v1/loss", json={**BASE, "config": {"dtype": "float64"}})
    assert with_it.json()["loss"] == without.json()["loss"]  # no correction chosen: the field changes nothing


def test_api_slow_path_reads_null_too() -> None:
    """A body the vectorised reader refuses (a bool among the rows) goes through the request model."""
    body = {**BASE, "per_token_logps": [[-1.0, -2.0, -0.5], [True]], "rollout_log_probs": [[-1.1, None, -0.4], [-0.3]]}
    response = client(raise_server_exceptions=False).post("/api/v1/loss", json=body)
    assert response.status_code in (200, 422)
    if response.status_code == 422:  # the bool, never the null
        assert all("rollout_log_probs" not in d["loc"] for d in response.json()["detail"])


@pytest.mark.parametrize(
    ("body", "loc", "words"),
    [
        ({**BASE, "sampling_per_token_logps": [[-1.0, -2.0, -0.5], [0.25]]}, ["sampling_per_token_logps", 1, 0], "0"),
        ({**BASE, "rollout_log_probs": [[-1.0, 0.5, None], [-0.2]]}, ["rollout_log_probs", 0, 1], "0"),
        ({**BASE, "old_per_token_logps": [[-1.0, None, -0.5], [-0.25]]}, ["old_per_token_logps", 0, 1], "number"),
    ],
)
def test_api_errors_name_field_row_position(body: dict[str, Any], loc: list[Any], words: str) -> None:
    response = client(raise_server_exceptions=False).post("/api/v1/loss", json=body)
    assert response.status_code == 422
    detail = response.json()["detail"]
    assert detail[0]["loc"][-3:] == loc and words in detail[0]["msg"]


def test_api_nan_outside_the_sampler_field_is_a_422() -> None:
    text = json.dumps({**BASE, "ref_per_token_logps": [[-1.0, NAN, -0.5], [-0.25]]})
    response = client(raise_server_exceptions=False).post(
        "/api/v1/loss", content=text.encode(), headers={"content-type": "application/json"}
    )
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"][-3:] == ["ref_per_token_logps", 0, 1]


# --- files -----------------------------------------------------------------------------------------
def padded_tensors(name: str) -> dict[str, torch.Tensor]:
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.25, 0.0, 0.0]])
    return {
        "per_token_logps": logp,
        "completion_mask": torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]]),
        "advantages": torch.tensor([1.0, -1.0]),
        name: torch.tensor([[-1.1, NAN, -0.4], [-0.3, 0.0, 0.0]]),
    }


def upload(fmt: str, name: str) -> bytes:
    tensors = padded_tensors(name)
    if fmt == "json":
        return json.dumps({**BASE, name: [[-1.1, None, -0.4], [-0.3]]}).encode()
    if fmt == "jsonl":
        lines = [
            {"per_token_logps": ROWS[0], "reward": 1.0, name: [-1.1, None, -0.4]},
            {"per_token_logps": ROWS[1], "reward": 0.0, name: [-0.3]},
        ]
        return "\n".join(json.dumps(line) for line in lines).encode()
    if fmt == "safetensors":
        from safetensors.torch import save

        return save(tensors)
    buffer = io.BytesIO()
    if fmt == "npz":
        np.savez(buffer, **{k: v.numpy() for k, v in tensors.items()})
    else:
        torch.save(tensors, buffer)
    return buffer.getvalue()


@pytest.mark.parametrize("fmt", ["json", "jsonl", "safetensors", "npz", "pt"])
@pytest.mark.parametrize("name", NAMES)
def test_every_upload_format_reads_it(fmt: str, name: str) -> None:
    batch = batch_from_request(load_file(f"batch.{fmt}", upload(fmt, name)))
    same(batch.sampling_per_token_logps, expected_grid())


def test_a_run_step_file_carries_it(tmp_path: Path) -> None:
    writer = RunWriter(tmp_path / "run", "upload", grpo.LossConfig())
    path = writer.write_step(1, 0, padded_tensors("sampling_per_token_logps"), meta={})
    batch, _, _ = load_step(path)
    same(batch.sampling_per_token_logps, expected_grid())
