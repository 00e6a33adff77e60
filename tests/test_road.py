"""grpo.road and grpo.requests: the one road from a request's bytes (or a decoder's fields) to a checked Batch.

A decoder's float32 arrays reach the Batch without a copy (the Batch's masked copy widens them), and the
Batch they make is the one their float64 copies make, bit for bit; through the road (a file's fields) they make
a float32 batch instead, whose answers are the float64 batch's for every registered variant; the vectorised
bounds the server judges before building a batch agree with the Batch's own checks; ``padded_fields`` words a
row's error as ``grpo.from_rows`` does. ``grpo.road.read_request`` takes the whole road in one call, the caller's
schema and price beside it, in that order; the app makes that one call per request and none of the road's parts.
"""

from __future__ import annotations

import dataclasses
import json
import re
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import torch

import grpo
from grpo.fields import BATCH_FIELDS
from grpo.requests import Flat, batch_from_request, padded_fields, within_bounds
from grpo.road import PER_TOKEN, FlatRefused, read_request

NAN, INF = float("nan"), float("inf")
B, T = 16, 24


def _float32_fields(seed: int = 0) -> dict[str, Any]:
    """A float32 batch as a safetensors file decodes it, with garbage (NaN, inf, positive) where nothing counts
    and the sampler's NaN ("not scored") at a counted token."""
    rng = np.random.default_rng(seed)
    mask = (rng.random((B, T)) < 0.8).astype(np.float32)
    mask[:, 0] = 1.0
    out: dict[str, Any] = {"completion_mask": mask, "rewards": rng.standard_normal(B).astype(np.float32)}
    for name in ("per_token_logps", "old_per_token_logps", "ref_per_token_logps", "sampling_per_token_logps"):
        values = -rng.exponential(1.0, (B, T)).astype(np.float32)
        values[mask == 0] = rng.choice(np.array([NAN, INF, 3.0], dtype=np.float32), int((mask == 0).sum()))
        out[name] = values
    out["sampling_per_token_logps"][0, 0] = NAN
    out["entropies"] = rng.exponential(1.0, (B, T)).astype(np.float32)
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(a.isnan(), b.isnan()))
    return bool(a == b)


def _tensors(batch: grpo.Batch) -> dict[str, Any]:
    return {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)} | {"mask_float": batch.mask_float}


@pytest.mark.numerical
def test_float32_arrays_make_the_batch_their_float64_copies_make() -> None:
    """Widening float32 to float64 is exact and the masked copy multiplies by 0 or 1 (exact too), so
    widening inside the copy (float32 values x float64 weights) gives the same bits as widening before it."""
    f32 = _float32_fields()
    f64 = {k: v.astype(np.float64) for k, v in f32.items()}
    got, want = _tensors(batch_from_request(f32)), _tensors(batch_from_request(f64))
    assert got.keys() == want.keys()
    for name, value in want.items():
        if isinstance(value, torch.Tensor):
            assert value.dtype == torch.float64 or not value.is_floating_point()
            assert _same(got[name], value), name
            torch.testing.assert_close(got[name], value, rtol=0, atol=0, equal_nan=True, msg=name)
        elif value is not None and not isinstance(value, dict):
            assert got[name] == value, name


def test_a_bad_float32_value_names_what_its_float64_copy_names() -> None:
    for name, bad in (("per_token_logps", 0.25), ("ref_per_token_logps", INF), ("entropies", -1.0)):
        f32 = _float32_fields(1)
        f32[name][3, 0] = bad  # position 0 counts on every row
        messages = []
        for fields in (f32, {k: v.astype(np.float64) for k, v in f32.items()}):
            with pytest.raises(grpo.GrpoInputError) as err:
                batch_from_request(fields)
            messages.append(str(err.value))
        assert messages[0] == messages[1] and messages[0].startswith(f"{name}[3]: ")


def test_a_float32_array_is_not_copied_before_the_batch_owns_it() -> None:
    """numpy reports its allocations to tracemalloc, torch's are not seen: widening a (256, 4096) float32 array
    with numpy first would show 8 MiB; the Batch's own tensors (torch's) show nothing."""
    logp = -np.ones((256, 4096), dtype=np.float32)
    before = logp.copy()
    tracemalloc.start()
    try:
        batch = grpo.Batch(per_token_logps=logp, old_per_token_logps=logp, rewards=np.zeros(256))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1024 * 1024, f"{peak} bytes of numpy arrays made on the way in"
    assert batch.logp.dtype == torch.float64 and float(batch.logp.sum()) == -256 * 4096
    assert np.array_equal(logp, before)  # the decoder's array is not written to
    assert batch.logp.data_ptr() != logp.ctypes.data  # the Batch holds its own copy


def _configs() -> list[dict[str, Any]]:
    """Every registered variant of every kind, under verl's preset, in float32 and float64, with and without a
    rollout correction (the batch carries the sampler's log-probs)."""
    from grpo.config import REGISTRIES

    variants = (
        {},
        {"dtype": "float64"},
        {"rollout_correction": "token_truncate"},
        {"rollout_correction": "sequence_mask"},
    )
    return [
        {"preset": "verl-grpo", "beta": 0.04, "dro_beta": 0.1, **extra, kind: name}
        for kind, registry in REGISTRIES.items()
        for name in registry.names()
        for extra in variants
    ]


@pytest.mark.numerical
def test_a_files_float32_arrays_make_a_float32_batch_with_the_same_answer() -> None:
    """The road hands a file's float32 arrays to the Batch as tensors: the batch stays float32 (no float64 copy
    twice the size, no cast in the evaluation), and every answer equals the float64 batch's bit for bit, as
    float32 widens to float64 exactly and the loss is computed in the config's dtype either way. The one text
    that differs is the entropies', shown as given: the float32 batch writes them as float32 (``0.43368205``),
    the float64 one as their widened value (``0.43368205428123474``): the same float32 numbers."""
    from grpo.road import CheckedRequest
    from grpo.view.answer import breakdown_to_json, dumps

    f32 = _float32_fields()
    before = {k: v.copy() for k, v in f32.items()}
    road = CheckedRequest({**f32, "group_size": 4}, [T] * B, None).batch()
    wide = batch_from_request({**{k: v.astype(np.float64) for k, v in f32.items()}, "group_size": 4})
    assert road.logp.dtype == torch.float32 and wide.logp.dtype == torch.float64
    assert all(np.array_equal(f32[k], before[k], equal_nan=True) for k in f32)  # the file's arrays not written to
    assert road.logp.data_ptr() != f32["per_token_logps"].ctypes.data  # the Batch holds its own copy
    compared = refused = 0
    for fields in _configs():
        try:
            config = grpo.LossConfig.resolve(fields)
            answers = [orjson.loads(dumps(breakdown_to_json(grpo.evaluate(batch, config)))) for batch in (road, wide)]
        except grpo.GrpoInputError:  # a variant this batch cannot feed (ReMax's baselines, Σπ²): both refuse it
            refused += 1
            continue
        shown = [np.array(a["tokens"].pop("entropies"), dtype=np.float32) for a in answers]
        assert np.array_equal(shown[0], shown[1]) and shown[0].shape == (B, T), fields
        assert orjson.dumps(answers[0]) == orjson.dumps(answers[1]), fields
        compared += 1
    assert compared >= 100 and refused < compared, (compared, refused)


def test_float64_beside_float32_keeps_the_road_in_float64() -> None:
    """A float64 field beside float32 ones: nothing is rounded to float32 (the Batch widens all of them)."""
    from grpo.road import CheckedRequest

    f32 = _float32_fields()
    f32["rewards"] = f32["rewards"].astype(np.float64) + 1e-12
    batch = CheckedRequest({**f32, "group_size": 4}, [T] * B, None).batch()
    assert batch.logp.dtype == torch.float64 and batch.rewards is not None
    assert torch.equal(batch.rewards, torch.from_numpy(f32["rewards"]))


CASES = {
    "per_token_logps": [[-1.0, 0.0], [-1e-300, 1e-300], [-INF, -1.0], [NAN, -1.0], [5e-324, -2.0]],
    "entropies": [[0.0, 1.0], [-0.0, 3.0], [-1e-12, 1.0], [INF, 0.5], [NAN, 0.5]],
    "sampling_per_token_logps": [[NAN, -1.0], [-INF, -1.0], [0.5, -1.0], [NAN, NAN]],
    "completion_mask": [[1.0, 0.0], [1.0, 0.5], [1.0, 2.0], [1.0, -0.0], [1.0, NAN]],
}


@pytest.mark.parametrize("name", list(CASES))
def test_the_servers_bounds_are_the_batchs_on_counted_tokens(name: str) -> None:
    """``within_bounds`` judges every value given; on a batch where every position counts the Batch judges the
    same values, so the two agree (the table, ``grpo.fields``, gives both their bounds)."""
    for row in CASES[name]:
        values = np.array([row], dtype=np.float64)
        fields: dict[str, Any] = {"per_token_logps": np.full((1, 2), -1.0), "rewards": [1.0], name: values}
        if name == "completion_mask":
            fields[name] = np.array([[1.0, row[1]]])
        try:
            batch_from_request(fields)
            accepted = True
        except grpo.GrpoInputError:
            accepted = False
        assert within_bounds(BATCH_FIELDS[name], values.reshape(-1)) == accepted, (name, row)


def test_padded_fields_word_a_rows_error_as_from_rows() -> None:
    rows = [[-1.0, -2.0], [-0.5]]
    for other in ([[-1.0, -2.0]], [[-1.0], [-0.5]]):  # a row missing; a row of another length
        with pytest.raises(grpo.GrpoInputError) as ragged:
            grpo.from_rows(rows, ref_per_token_logps=other, rewards=[1.0, 0.0])
        lengths = np.array([len(r) for r in rows])
        flat = Flat(np.array([v for r in other for v in r]), np.array([len(r) for r in other]))
        with pytest.raises(grpo.GrpoInputError) as padded:
            padded_fields({"ref_per_token_logps": flat}, lengths, ["ref_per_token_logps"])
        assert str(padded.value) == str(ragged.value)


def test_padded_fields_mask_the_padding() -> None:
    lengths = np.array([2, 1])
    fields = padded_fields(
        {"per_token_logps": Flat(np.array([-1.0, -2.0, -0.5]), lengths)}, lengths, ["per_token_logps"]
    )
    assert fields["per_token_logps"].tolist() == [[-1.0, -2.0], [-0.5, 0.0]]
    assert fields["completion_mask"].tolist() == [[1.0, 1.0], [1.0, 0.0]]


# --- grpo.road.read_request: the whole road in one call, the caller's checks beside it ------------------------
class Recorded:
    """``grpo.road.Checks`` without a schema: every call noted in order; the other fields taken as given."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def not_json(self, exc: ValueError) -> Exception:
        return LookupError(f"not JSON: {exc}")

    def others(self, body: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        self.calls.append(("others", {k: body[k] for k in sorted(body) if k in PER_TOKEN}))
        return "schema's object", {k: v for k, v in body.items() if k in BATCH_FIELDS and k not in PER_TOKEN}

    def whole(self, body: Any) -> tuple[Any, dict[str, Any]]:
        self.calls.append(("whole",))
        return "schema's object", {k: v for k, v in body.items() if k in BATCH_FIELDS}

    def price(self, lengths: Any, grids: int, model: Any) -> None:
        self.calls.append(("price", [int(n) for n in lengths], grids))


ROWS = {"per_token_logps": [[-1.0, -2.0], [-0.5]], "old_per_token_logps": [[-1.5, -2.0], [-0.25]], "rewards": [1, 0]}


def test_the_road_checks_the_others_then_prices_then_pads_and_makes_the_batch_of_the_lists() -> None:
    """JSON text: the per-token fields read straight into arrays, the caller's schema shown a placeholder in their
    place (one value inside the bounds: 0 for a log-prob), the price asked for 2 rows of lengths 2 and 1 and two
    (B, T) fields before any grid exists, then the grid padded with 0, its mask 1 where a row has a value."""
    checks = Recorded()
    road = read_request(json.dumps({**ROWS, "group_size": 2}).encode(), checks)
    assert checks.calls == [
        ("others", {"old_per_token_logps": [[0.0]], "per_token_logps": [[0.0]]}),
        ("price", [2, 1], 2),
    ]
    assert road.lengths == [2, 1] and road.model == "schema's object"
    assert road.fields["per_token_logps"].tolist() == [[-1.0, -2.0], [-0.5, 0.0]]
    assert road.fields["completion_mask"].tolist() == [[1.0, 1.0], [1.0, 0.0]]
    batch, exact = (
        road.batch(),
        grpo.from_rows(ROWS["per_token_logps"], old_per_token_logps=ROWS["old_per_token_logps"], rewards=[1, 0]),
    )
    assert road.fields == {}  # the batch holds its own tensors: the request's arrays are let go
    for name in ("per_token_logps", "old_per_token_logps", "completion_mask", "rewards"):
        assert torch.equal(getattr(batch, name), getattr(exact, name)), name


def test_a_value_the_vectorised_checks_refuse_goes_to_the_callers_exact_check() -> None:
    """A log-prob of +0.5 is past the field's bound (<= 0): the whole body goes to ``Checks.whole`` (in the server,
    pydantic names its row and position) at once, priced as ragged lists; a Flat field is refused to its caller."""
    checks = Recorded()
    bad = {**ROWS, "per_token_logps": [[-1.0, 0.5], [-0.5]]}
    road = read_request(json.dumps(bad).encode(), checks)
    assert [c[0] for c in checks.calls] == ["others", "whole", "price"] and checks.calls[-1] == ("price", [2, 1], 2)
    assert road.fields["per_token_logps"] == [[-1.0, 0.5], [-0.5]]  # as given: the exact check's
    with pytest.raises(grpo.GrpoInputError) as found:
        road.batch()
    assert (found.value.field, found.value.row) == ("per_token_logps", 0)
    flat = {"per_token_logps": Flat(np.array([-1.0, 0.5, -0.5]), np.array([2, 1])), "rewards": [1, 0]}
    with pytest.raises(FlatRefused):
        read_request(flat, Recorded())
    with pytest.raises(LookupError, match="not JSON"):
        read_request(b"{not json", Recorded())


def test_a_files_tensors_are_priced_by_their_grid_and_the_unknown_ones_reported() -> None:
    checks = Recorded()
    fields = {"per_token_logps": -np.ones((2, 3)), "tokens": np.array([["a"] * 3] * 2), "foo": np.ones(3)}
    road = read_request(fields, checks, from_file=True)
    assert checks.calls == [("price", [3, 3], 2)]  # per_token_logps and foo: the display strings are no grid
    assert road.ignored == ["foo"] and road.model is None


@pytest.mark.parametrize("how", ["loss", "upload-json", "upload-safetensors"])
def test_the_app_takes_the_road_in_one_call(how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A request enters ``grpo.road.read_request`` once (the app calls none of the road's parts itself)."""
    from fastapi.testclient import TestClient
    from safetensors.numpy import save

    import app.ingest
    from app.main import create_app
    from app.settings import Settings

    calls: list[int] = []

    def counted(*args: Any, **kw: Any) -> Any:
        calls.append(1)
        return read_request(*args, **kw)

    monkeypatch.setattr(app.ingest, "read_request", counted)
    body = {**ROWS, "group_size": 2}
    with TestClient(create_app(Settings(process_workers=0))) as http:
        if how == "loss":
            response = http.post("/api/v1/loss", json=body)
        elif how == "upload-json":
            response = http.post("/api/v1/upload", files={"file": ("b.json", json.dumps(body).encode())})
        else:
            arrays = {"per_token_logps": -np.ones((2, 3), dtype=np.float32), "rewards": np.array([1.0, 0.0])}
            response = http.post("/api/v1/upload", files={"file": ("b.safetensors", save(arrays))})
    assert response.status_code == 200, response.text
    assert calls == [1]


def test_the_app_imports_none_of_the_roads_parts() -> None:
    parts = ("padded_fields", "within_bounds", "read_arrays", "batch_from_request", "from_rows", "Flat")
    for path in sorted(Path(__file__).resolve().parent.parent.joinpath("app").glob("*.py")):
        source = path.read_text()
        assert not [p for p in parts if re.search(rf"\b{p}\b", source)], path.name
