"""grpo.export and /api/v1/export, /api/v1/examples: every format reads back through the upload to
the same batch (the same loss, bit for bit, since values are written as float64)."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from safetensors.numpy import load

from app.main import app
from grpo.examples import SCENARIOS
from grpo.export import FORMATS, padded_arrays

client = TestClient(app)


def _loss(body: dict[str, Any]) -> float:
    r = client.post("/api/v1/loss", json=body)
    assert r.status_code == 200, r.text
    return float(r.json()["loss"])


def test_padded_arrays_mark_the_padding() -> None:
    arrays = padded_arrays({"per_token_logps": [[-0.5, -1.0, -0.2], [-0.3]], "rewards": [1.0, 0.0], "group_size": 2})
    assert arrays["completion_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert arrays["per_token_logps"].tolist() == [[-0.5, -1.0, -0.2], [-0.3, 0.0, 0.0]]
    assert arrays["group_size"].shape == () and int(arrays["group_size"]) == 2  # a 0-d scalar
    assert arrays["rewards"].dtype == np.float64


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("name", ["article", "length-bias", "kl-blowup"])
def test_export_reads_back_through_the_upload(fmt: str, name: str) -> None:
    request = SCENARIOS[name].request
    exported = client.post(f"/api/v1/export/{fmt}", json=request)
    assert exported.status_code == 200, exported.text
    uploaded = client.post("/api/v1/upload", files={"file": (f"batch.{fmt}", exported.content)})
    assert uploaded.status_code == 200, uploaded.text
    assert uploaded.json()["loss"] == _loss(dict(request))


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_each_format_has_an_example(fmt: str) -> None:
    r = client.get(f"/api/v1/examples/{fmt}")
    assert r.status_code == 200 and "attachment" in r.headers["content-disposition"]
    uploaded = client.post("/api/v1/upload", files={"file": (f"example.{fmt}", r.content)})
    assert uploaded.json()["loss"] == _loss(dict(SCENARIOS["article"].request))
    if fmt == "safetensors":
        assert load(r.content)["per_token_logps"].shape == (3, 5)
    if fmt == "npz":
        assert np.load(io.BytesIO(r.content))["tokens"].shape == (3, 5)


def test_export_rejects_an_unknown_format_and_a_bad_batch() -> None:
    assert client.get("/api/v1/examples/pickle").status_code == 422
    r = client.post("/api/v1/export/npz", json={"per_token_logps": "nope"})
    assert r.status_code == 422 and "per_token_logps" in r.text


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"per_token_logps": [[-0.5]], "old_per_token_logps": [[-0.5, -1.0]], "rewards": [1.0]}, "old_per_token_logps"),
        ({"per_token_logps": [[-0.5, -1.0]], "rewards": [1.0], "tokens": [["a"]]}, "tokens"),
        ({"per_token_logps": [[-0.5]], "rewards": []}, "rewards"),
    ],
)
def test_export_checks_the_batch_like_an_evaluation(body: dict[str, Any], field: str) -> None:
    for fmt in FORMATS:
        r = client.post(f"/api/v1/export/{fmt}", json=body)
        assert r.status_code == 422 and field in r.text, (fmt, r.text)
