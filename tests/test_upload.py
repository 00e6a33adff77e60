"""POST /api/v1/upload: one batch in every format gives /api/v1/loss's answer; logits go through
token_logprobs; pickles and object arrays are refused without running; limits and form fields.
"""

from __future__ import annotations

import io
import json
import os
import pickle
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from api_fixtures import assert_same_numbers, client, error_detail, ragged_body
from fastapi.testclient import TestClient
from safetensors.torch import save as save_safetensors

import grpo
from app.settings import get_settings
from grpo.io import UPLOAD_FORMATS, load_file

B, T = 4, 6


@pytest.fixture(scope="module")
def api() -> TestClient:
    return client(raise_server_exceptions=False)


def rectangular() -> dict[str, torch.Tensor]:
    """A (4, 6) float64 batch, ragged through its mask (trailing zeros), rewards in groups of 2."""
    g = torch.Generator().manual_seed(7)
    old = -(torch.rand(B, T, generator=g, dtype=torch.float64) * 3 + 0.05)
    logp = (old + 0.5 * torch.randn(B, T, generator=g, dtype=torch.float64)).clamp(max=-1e-3)
    ref = (logp + 0.4 * torch.randn(B, T, generator=g, dtype=torch.float64)).clamp(max=-1e-3)
    mask = (torch.arange(T)[None, :] < torch.tensor([6, 3, 5, 1])[:, None]).to(torch.float64)
    return {
        "per_token_logps": logp,
        "old_per_token_logps": old,
        "ref_per_token_logps": ref,
        "completion_mask": mask,
        "rewards": torch.tensor([1.0, 0.0, 2.0, 2.0], dtype=torch.float64),
        "group_size": torch.tensor(2),
    }


def as_json(tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    return {k: (v.item() if v.dim() == 0 else v.tolist()) for k, v in tensors.items()}


def npz_bytes(**arrays: Any) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def pt_bytes(obj: Any, **kwargs: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer, **kwargs)
    return buffer.getvalue()


def upload(api: TestClient, name: str, data: bytes, **form: str) -> Any:
    return api.post("/api/v1/upload", files={"file": (name, data)}, data=form)


def loss(api: TestClient, body: dict[str, Any]) -> dict[str, Any]:
    response = api.post("/api/v1/loss", json=body)
    assert response.status_code == 200, response.text[:300]
    result: dict[str, Any] = response.json()
    return result


# --- every format: the same batch, the same answer ---------------------------------------------------
def encode(fmt: str, tensors: dict[str, torch.Tensor]) -> tuple[str, bytes]:
    if fmt == "safetensors":
        return "batch.safetensors", save_safetensors(tensors)
    if fmt == "npz":
        return "batch.npz", npz_bytes(**{k: v.numpy() for k, v in tensors.items()})
    if fmt == "pt":
        return "batch.pt", pt_bytes(tensors)
    raise AssertionError(fmt)


@pytest.mark.parametrize("fmt", ["safetensors", "npz", "pt"])
def test_tensor_formats_give_the_loss_endpoints_answer(api: TestClient, fmt: str) -> None:
    tensors = rectangular()
    name, data = encode(fmt, tensors)
    response = upload(api, name, data, config='{"preset": "verl-grpo", "beta": 0.1}')
    assert response.status_code == 200, response.text[:300]
    body = {**as_json(tensors), "config": {"preset": "verl-grpo", "beta": 0.1}}
    assert response.json() == loss(api, body)


def test_options_list_the_formats_the_upload_reads(api: TestClient) -> None:
    """/api/v1/options's formats (the page's upload label, accepted extensions, examples and export
    buttons) are what the upload reads: a file under every listed extension gives the same answer, an
    example exists for every format marked export, and the accept list is the extensions in order."""
    formats = api.get("/api/v1/options").json()["formats"]
    assert [f["name"] for f in formats["upload"]] == [f.name for f in UPLOAD_FORMATS]
    assert formats["accept"] == ",".join(ext for f in formats["upload"] for ext in f["extensions"])
    tensors = rectangular()
    expected = loss(api, {**as_json(tensors), "config": {"preset": "article"}})
    for fmt in formats["upload"]:
        if fmt["export"]:
            assert api.get(f"/api/v1/examples/{fmt['name']}").status_code == 200, fmt
            data = api.post(f"/api/v1/export/{fmt['name']}", json=as_json(tensors)).content
        else:
            data = encode(fmt["name"], tensors)[1]
        for ext in fmt["extensions"]:
            response = upload(api, f"batch{ext}", data, config='{"preset": "article"}')
            assert response.status_code == 200, (ext, response.text[:300])
            assert response.json()["loss"] == expected["loss"], ext


def test_inputs_in_fewer_bits_than_the_computation_are_noted(api: TestClient) -> None:
    """bf16 log-probs computed in float32 (and float32 ones in float64) were rounded before GRPO Lens saw
    them: the answer says so, naming the tensor; inputs as precise as the computation get no note."""
    tensors = rectangular()
    low = {**tensors, "per_token_logps": tensors["per_token_logps"].to(torch.bfloat16)}
    warnings = upload(api, "bf16.safetensors", save_safetensors(low)).json()["warnings"]
    noted = [w for w in warnings if "arrived as" in w]
    assert len(noted) == 1 and noted[0].startswith("per_token_logps arrived as bfloat16"), warnings
    same = {k: (v.double() if v.is_floating_point() else v) for k, v in tensors.items()}
    warnings = upload(api, "f64.safetensors", save_safetensors(same), config='{"dtype": "float64"}').json()["warnings"]
    assert not [w for w in warnings if "arrived as" in w], warnings
    single = {k: (v.float() if v.is_floating_point() else v) for k, v in tensors.items()}
    warnings = upload(api, "f32.safetensors", save_safetensors(single), config='{"dtype": "float64"}').json()[
        "warnings"
    ]
    assert any(w.startswith("per_token_logps arrived as float32") for w in warnings), warnings


def test_json_upload_is_the_loss_body(api: TestClient) -> None:
    body = {**ragged_body(2), "config": {"preset": "trl-grpo"}}
    response = upload(api, "batch.json", json.dumps(body).encode())
    assert response.status_code == 200, response.text[:300]
    assert response.json() == loss(api, body)


def test_jsonl_upload_is_one_row_a_line(api: TestClient) -> None:
    body = ragged_body(4)
    keys = ("per_token_logps", "old_per_token_logps", "ref_per_token_logps", "completion_mask", "tokens")
    lines = [
        {**{k: body[k][i] for k in keys}, "reward": body["rewards"][i], "prompt_length": body["prompt_lengths"][i]}
        for i in range(len(body["rewards"]))
    ]
    text = "\n".join(json.dumps(x) for x in [{"group_size": 3, "config": {"preset": "article"}}, *lines])
    response = upload(api, "batch.jsonl", text.encode())
    assert response.status_code == 200, response.text[:300]
    assert response.json() == loss(api, body)


def test_verl_names_in_a_tensor_file(api: TestClient) -> None:
    tensors = rectangular()
    verl = {
        "log_prob": tensors["per_token_logps"],
        "old_log_prob": tensors["old_per_token_logps"],
        "ref_log_prob": tensors["ref_per_token_logps"],
        "response_mask": tensors["completion_mask"],
        "rewards": tensors["rewards"],
        "group_size": tensors["group_size"],
    }
    response = upload(api, "verl.safetensors", save_safetensors(verl))
    assert response.status_code == 200, response.text[:300]
    assert response.json() == loss(api, as_json(tensors))


def test_logits_go_through_token_logprobs(api: TestClient) -> None:
    """logits (B, T, V) and token ids: the log-probs, mask and entropies are the library's."""
    g = torch.Generator().manual_seed(3)
    logits, ref_logits = torch.randn(2, 7, 11, generator=g), torch.randn(2, 7, 11, generator=g)
    ids = torch.randint(0, 11, (2, 7), generator=g)
    tensors = {
        "logits": logits,
        "ref_logits": ref_logits,
        "token_ids": ids,
        "prompt_length": torch.tensor(3),
        "advantages": torch.tensor([1.0, -1.0]),
    }
    response = upload(api, "logits.safetensors", save_safetensors(tensors))
    assert response.status_code == 200, response.text[:300]
    out = grpo.token_logprobs(logits, ids, 3, ref_logits=ref_logits)
    bd = grpo.evaluate(
        grpo.Batch(
            per_token_logps=out.logps.double().numpy(),
            ref_per_token_logps=out.ref_logps.double().numpy() if out.ref_logps is not None else None,
            completion_mask=out.mask.double().numpy(),
            entropies=out.entropies.double().numpy(),
            advantages=[1.0, -1.0],
        ),
        grpo.LossConfig.from_preset("article"),
    )
    width = out.logps.shape[1]
    assert_same_numbers(response.json(), bd, [width, width])
    assert "entropy" in response.json()["metrics"]


def test_unknown_tensors_are_reported_not_silently_dropped(api: TestClient) -> None:
    tensors = {**rectangular(), "old_logps_typo": torch.zeros(B, T)}
    response = upload(api, "typo.safetensors", save_safetensors(tensors))
    assert response.status_code == 200
    assert any("old_logps_typo" in w for w in response.json()["warnings"])


# --- nothing is unpickled or run ---------------------------------------------------------------------
class Payload:
    """Pickles to a call that creates ``marker``: unpickling it runs code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.marker,))


def test_payload_runs_when_unpickled(tmp_path: Path) -> None:
    """The payload is live: plain pickle.loads does run it (so the refusals below mean something)."""
    marker = tmp_path / "ran"
    pickle.loads(pickle.dumps(Payload(marker)))
    assert marker.exists()


@pytest.mark.filterwarnings("ignore:Detected pickle protocol:UserWarning")
@pytest.mark.parametrize(
    "make",
    [
        lambda p: ("evil.pt", pickle.dumps({"per_token_logps": Payload(p)})),
        lambda p: ("evil.pt", pt_bytes({"per_token_logps": torch.zeros(1, 2), "x": Payload(p)})),
        lambda p: ("evil.pth", pt_bytes({"x": Payload(p)}, _use_new_zipfile_serialization=False)),
        lambda p: ("evil.npz", npz_bytes(per_token_logps=np.array([Payload(p)], dtype=object))),
        lambda p: ("ragged.npz", npz_bytes(per_token_logps=np.array([[-1.0], [-0.5, -0.2]], dtype=object))),
    ],
    ids=["pickle", "torch-zip", "torch-legacy", "npz-object-payload", "npz-object-ragged"],
)
def test_pickles_and_object_arrays_are_refused_without_running(api: TestClient, tmp_path: Path, make: Any) -> None:
    marker = tmp_path / "ran"
    name, data = make(marker)
    assert not marker.exists()
    detail = error_detail(upload(api, name, data), 422)
    assert detail[0]["loc"] == ["body", "file"]
    assert "weights_only" in detail[0]["msg"] or "pickle" in detail[0]["msg"]
    assert not marker.exists(), "the upload ran the pickled payload"


# --- bad files and form fields --------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "data", "loc", "words"),
    [
        ("batch.txt", b"{}", ["body", "file"], [".json", ".jsonl", ".safetensors", ".npz", ".pt"]),
        ("batch.json", b"{not json", ["body", "file"], ["valid JSON"]),
        ("batch.json", b"[1, 2]", ["body", "file"], ["JSON object"]),
        ("batch.json", b'{"rewards": [1]}', ["body", "file", "per_token_logps"], ["required"]),
        ("batch.json", b'{"per_token_logps": [[0.5]], "rewards": [1]}', ["body", "file", "per_token_logps", 0, 0], []),
        ("batch.jsonl", b"", ["body", "file", "per_token_logps"], ["required"]),
        ("batch.jsonl", b'{"per_token_logps": [-1], "reward": 1}\n[1]\n', ["body", "file", 1], ["JSON object"]),
        ("batch.safetensors", b"\x00" * 64, ["body", "file"], ["safetensors"]),
        ("batch.npz", b"PK\x03\x04 not a zip", ["body", "file"], ["NPZ"]),
        ("batch.pt", b"\x80\x02garbage", ["body", "file"], ["weights_only"]),
        ("list.pt", pt_bytes([torch.zeros(1, 2)]), ["body", "file"], ["dict of named tensors"]),
        ("complex.npz", npz_bytes(per_token_logps=np.ones((1, 2), complex)), ["body", "per_token_logps"], ["numeric"]),
        (
            "positive.npz",
            npz_bytes(per_token_logps=np.ones((1, 2)), rewards=np.ones(1)),
            ["body", "per_token_logps", 0],
            ["<= 0"],
        ),
        (
            "3d.npz",
            npz_bytes(per_token_logps=-np.ones((1, 2, 2)), rewards=np.ones(1)),
            ["body", "per_token_logps"],
            ["2-D"],
        ),
        ("ids.safetensors", save_safetensors({"logits": torch.zeros(1, 3, 4)}), ["body", "token_ids"], ["token ids"]),
        (
            "unnamed.safetensors",
            save_safetensors({"logp": -torch.ones(2, 3), "rewards": torch.ones(2)}),
            ["body", "file", "per_token_logps"],
            ["required"],
        ),
    ],
)
def test_bad_files_get_a_422_that_says_what(
    api: TestClient, name: str, data: bytes, loc: list[Any], words: list[str]
) -> None:
    detail = error_detail(upload(api, name, data), 422)
    assert detail[0]["loc"][: len(loc)] == loc, detail
    assert all(word in detail[0]["msg"] for word in words), detail[0]["msg"]


OK_JSON = json.dumps({"per_token_logps": [[-1.0, -2.0], [-0.5]], "rewards": [1.0, 0.0]}).encode()


@pytest.mark.parametrize(
    ("form", "loc", "words"),
    [
        ({"config": "{bad"}, ["body", "config"], ["JSON"]),
        ({"config": "[1]"}, ["body", "config"], ["dictionary"]),
        ({"config": '{"beta": -1}'}, ["body", "config", "beta"], [">= 0"]),
        ({"config": '{"preset": "nope"}'}, ["body", "config", "preset"], list(grpo.PRESETS)),
        ({"config": '{"eps": 1}'}, ["body", "config", "eps"], ["LossConfig field"]),
        ({"token_rows": "[5]"}, ["body", "token_rows", 0], ["below 2"]),
        ({"token_rows": '["a"]'}, ["body", "token_rows", 0], ["integer"]),
        ({"token_rows": "[-1]"}, ["body", "token_rows", 0], ["greater than or equal to 0"]),
        ({"heatmap_rows": '"every"'}, ["body", "heatmap_rows"], ["'shown' or 'all'"]),
        ({"heatmap_rows": "all"}, ["body", "heatmap_rows"], ["JSON"]),
    ],
)
def test_bad_form_fields_get_a_422(api: TestClient, form: dict[str, str], loc: list[Any], words: list[str]) -> None:
    detail = error_detail(upload(api, "ok.json", OK_JSON, **form), 422)
    assert detail[0]["loc"] == loc
    assert all(word in detail[0]["msg"] for word in words), detail[0]["msg"]


def test_no_file_is_a_422(api: TestClient) -> None:
    detail = error_detail(api.post("/api/v1/upload", data={"config": "{}"}), 422)
    assert detail[0]["loc"] == ["body", "file"]


def test_form_config_overrides_the_files(api: TestClient) -> None:
    body = {**json.loads(OK_JSON), "config": {"preset": "verl-grpo", "beta": 0.2}}
    response = upload(api, "cfg.json", json.dumps(body).encode(), config='{"beta": 0.5}', token_rows="[1]")
    assert response.status_code == 200
    data = response.json()
    assert (data["config"]["preset"], data["config"]["beta"]) == ("verl-grpo", 0.5)
    assert data["token_rows"] == [1]


def test_heatmap_rows_in_the_form_as_in_loss(api: TestClient) -> None:
    """The form's heatmap_rows ('"all"', JSON text like the other fields) gives /api/v1/loss's grid."""
    body = json.loads(OK_JSON)
    response = upload(api, "b.json", OK_JSON, token_rows="[1]", heatmap_rows='"all"')
    assert response.status_code == 200, response.text[:300]
    want = loss(api, {**body, "token_rows": [1], "heatmap_rows": "all"})["heatmap"]
    assert response.json()["heatmap"] == want and want["rows"] == list(range(len(body["per_token_logps"])))


def test_a_file_past_the_upload_limit_gets_413(api: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(get_settings(), "max_upload_bytes", 4096)
    big = os.urandom(5000)  # over the file limit, under the request limit (file limit + 64 KiB)
    detail = error_detail(upload(api, "big.safetensors", big), 413)
    assert detail[0]["loc"] == ["body", "file"] and "4096 bytes" in detail[0]["msg"]
    huge = os.urandom(4096 + 70_000)  # past the request limit: refused before the app reads it
    detail = error_detail(upload(api, "huge.safetensors", huge), 413)
    assert detail[0]["loc"] == ["body"]
    assert upload(api, "ok.json", OK_JSON).status_code == 200


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("deep.json", b'{"per_token_logps": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),  # RecursionError
        ("deep.jsonl", b"[" * 100_000 + b"\n"),
        ("digits.json", b'{"per_token_logps": [[-1]], "rewards": [1], "group_size": ' + b"9" * 5000 + b"}"),
    ],
    ids=["nested-100k", "jsonl-nested-100k", "int-5000-digits"],
)
def test_json_the_parser_refuses_is_a_422(api: TestClient, name: str, data: bytes) -> None:
    detail = error_detail(upload(api, name, data), 422)
    assert detail[0]["loc"][:2] == ["body", "file"]


def test_a_zip_bomb_npz_is_refused_before_it_unpacks(monkeypatch: pytest.MonkeyPatch) -> None:
    # 64 MiB of zeros deflates to ~64 KiB; the zip's directory declares the unpacked size, which
    # load_file checks against the limit before numpy decompresses anything.
    buffer = io.BytesIO()
    np.savez_compressed(buffer, per_token_logps=np.zeros((4096, 2048), dtype=np.float64))
    data = buffer.getvalue()
    assert len(data) < 1_000_000
    with pytest.raises(grpo.GrpoInputError, match="once unpacked"):
        load_file("bomb.npz", data, max_unpacked_bytes=16 * 1024 * 1024)
    monkeypatch.setattr(get_settings(), "max_unpacked_bytes", 16 * 1024 * 1024)
    response = client().post("/api/v1/upload", files={"file": ("bomb.npz", data)})
    assert response.status_code == 413  # too large once unpacked, priced from the zip's directory
    assert response.json()["detail"][0]["loc"][:2] == ["body", "file"]
    assert "once unpacked" in response.json()["detail"][0]["msg"]


def test_npz_token_strings_are_read_without_pickle() -> None:
    buffer = io.BytesIO()
    np.savez(
        buffer, per_token_logps=np.array([[-0.5, -1.0]]), advantages=np.array([1.0]), tokens=np.array([["a", "<b>"]])
    )
    request = load_file("t.npz", buffer.getvalue())
    assert request["tokens"] == [["a", "<b>"]]


def test_forms_past_their_limits_are_422(api: TestClient) -> None:
    """The form parser keeps at most 2 files and 8 fields, and a field of at most 1 MiB of UTF-8 text."""
    three = [("file", (f"f{i}.json", OK_JSON)) for i in range(3)]
    assert error_detail(api.post("/api/v1/upload", files=three), 422)[0]["loc"] == ["body"]
    big = {"config": "x" * (1024 * 1024 + 1)}
    detail = error_detail(api.post("/api/v1/upload", files={"file": ("a.json", OK_JSON)}, data=big), 422)
    assert "larger than" in detail[0]["msg"]
    bad = b'--b\r\nContent-Disposition: form-data; name="config"\r\n\r\n\xff\xfe\r\n--b--\r\n'
    response = api.post("/api/v1/upload", content=bad, headers={"content-type": "multipart/form-data; boundary=b"})
    assert error_detail(response, 422)[0]["type"] == "form_invalid"


@pytest.mark.parametrize(
    ("name", "light"),
    [
        ("batch.safetensors", True),
        ("BATCH.NPZ", True),
        ("batch.json", False),
        ("batch.jsonl", False),
        ("batch.pt", False),  # torch's unpickler (restricted) runs in Python: a worker's job when large
        ("batch.safetensors.json", False),
    ],
)
def test_binary_uploads_are_recognised_from_the_form_header(name: str, light: bool) -> None:
    """Which lane: a binary file copies numbers (milliseconds of GIL) and stays in the server's threads;
    text is parsed (seconds of GIL when large) and goes to a worker process."""
    from app.work import binary_upload

    body = httpx.Request("POST", "http://x/", files={"file": (name, b"{}")}, data={"config": "{}"}).read()
    assert binary_upload(body) is light
    assert binary_upload(b"x" * 70000 + body) is False  # past the first 64 KiB: the size decides
