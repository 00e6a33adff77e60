"""app.ingest: the fast JSON reader (simdjson, straight into arrays) gives exactly what the exact
reader (orjson, then the vectorised checks or the model) gives, for valid and invalid bodies alike:
the same arrays, row lengths and fields, or the same status and error items."""

from __future__ import annotations

import json
from functools import partial
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app import work
from app.errors import as_api_error
from app.ingest import prepare, prepare_json, read_json
from app.schemas import LossRequest
from app.settings import Settings
from grpo.answer import dumps

SETTINGS = Settings()

# Values a row may hold: mostly log-probs, sometimes what the checks must refuse or the fast reader
# must decline (non-finite, positive, bools, strings, nulls, nested lists).
logp = st.floats(min_value=-30.0, max_value=0.0) | st.integers(min_value=-5, max_value=0)
odd = st.sampled_from([0.5, 3, True, None, "x", [-1.0], [], float("nan"), float("inf"), 1e308])
value = st.one_of(logp, logp, logp, logp, logp, logp, odd)
rows = st.lists(st.lists(value, max_size=5), max_size=4) | st.sampled_from([[], [-1.0], "rows", None, [[[-1.0]]]])
mask_rows = st.lists(st.lists(st.sampled_from([0, 1, 1, 1, 1.0, 2, -1]), max_size=5), max_size=4)


@st.composite
def bodies(draw: Any) -> bytes:
    body: dict[str, Any] = {}
    per_token = draw(st.lists(st.lists(logp, min_size=1, max_size=5), min_size=1, max_size=4))
    body[draw(st.sampled_from(["per_token_logps", "log_prob", "pi_logprob"]))] = per_token
    if draw(st.booleans()):  # an old/ref field of the same shape, or of any shape at all
        same = [[draw(value) for _ in row] for row in per_token]
        body[draw(st.sampled_from(["old_per_token_logps", "old_log_prob", "ref_per_token_logps"]))] = draw(
            st.just(same) | rows
        )
    if draw(st.booleans()):
        body["completion_mask"] = draw(st.just([[1] * len(r) for r in per_token]) | mask_rows)
    if draw(st.booleans()):  # an alias beside its name: refused, whichever reader
        body["per_token_logps" if "per_token_logps" not in body else "log_prob"] = per_token
    body["rewards"] = draw(st.just([1.0] * len(per_token)) | st.lists(st.sampled_from([0.0, 1, "x"]), max_size=5))
    body["group_size"] = draw(st.sampled_from([1, len(per_token), 0, "2"]))
    if draw(st.booleans()):
        body["tokens"] = [[draw(st.sampled_from(["a", "[", "]", "é", '"'])) for _ in row] for row in per_token]
    if draw(st.booleans()):
        body["config"] = draw(st.sampled_from([{"preset": "verl-grpo"}, {"beta": -1}, {"aggregation": [1]}, []]))
    return json.dumps(body, allow_nan=True).encode()


def outcome(fn: Any) -> tuple[Any, ...]:
    try:
        prepared = fn()
    except Exception as exc:
        error = as_api_error(exc, "test")
        return ("error", error.status, error.items)
    fields = {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in prepared.fields.items()}
    return ("ok", fields, prepared.lengths, prepared.model.model_dump())


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=bodies())
def test_the_fast_reader_agrees_with_the_exact_one(body: bytes) -> None:
    fast = outcome(lambda: prepare_json(body, LossRequest, SETTINGS))
    exact = outcome(lambda: prepare(read_json(body, ["body"]), LossRequest, SETTINGS))
    assert fast == exact


def upload_outcome(monkeypatch: Any, body: bytes, fast: bool) -> tuple[Any, ...]:
    """POST /api/v1/upload's work for ``body`` as a .json file, by the fast reader or (``fast`` False) the exact one."""
    boundary = "b0undary"
    form = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="batch.json"\r\n'
            f"Content-Type: application/json\r\n\r\n"
        ).encode()
        + body
        + f"\r\n--{boundary}--\r\n".encode()
    )
    with monkeypatch.context() as m:
        if not fast:
            m.setattr(work, "json_file_fields", lambda filename, data: None)
        try:
            return ("ok", dumps(work.upload(form, f"multipart/form-data; boundary={boundary}", SETTINGS)))
        except Exception as exc:
            error = as_api_error(exc, "test")
            return ("error", error.status, error.items)


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(body=bodies())
def test_an_uploaded_json_file_reads_the_same_fast_or_exact(monkeypatch: Any, body: bytes) -> None:
    """A .json upload goes through the fast reader too: the same answer, byte for byte, or the same error."""
    assert upload_outcome(monkeypatch, body, fast=True) == upload_outcome(monkeypatch, body, fast=False)


def test_per_token_numbers_are_json_numbers_on_every_path() -> None:
    # the schema says "number": true and "0.5" are refused with the value's position, whether the body is small
    # (the model), large with the bad value among the numbers (the vectorised reader falls back to the model), or
    # already parsed (prepare); an int is a number
    for bad in (True, "0.5"):
        for width in (3, 4096):
            rewards = [[0.0] * width for _ in range(4)]
            rewards[2][1] = bad
            body = {"per_token_logps": [[-0.5] * width for _ in range(4)], "token_level_rewards": rewards}
            text = json.dumps(body).encode()
            for read in (partial(prepare_json, text), partial(prepare, body)):
                kind, status, items = outcome(lambda read=read: read(LossRequest, SETTINGS))
                assert (kind, status) == ("error", 422), (bad, width)
                assert items[0]["loc"] == ["body", "token_level_rewards", 2, 1], items
    whole = {"per_token_logps": [[-1, -0.5]], "token_level_rewards": [[0, 1]]}
    assert prepare(whole, LossRequest, SETTINGS).lengths == [2]
