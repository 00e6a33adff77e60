"""Every bad input gets a 4xx in FastAPI's {"detail": [...]} shape that names the field and row and
says what was expected; nothing gives a 500 or a traceback. The catalogue is one parametrised test:
each case is a body (a dict sent as JSON, or raw bytes), the status, where ``loc`` must point, and
words the message must hold.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from api_fixtures import ARTICLE, client, error_detail
from fastapi.testclient import TestClient

import grpo
from app.errors import MAX_ERRORS
from app.settings import Settings, get_settings

ROWS = [[-1.0, -2.0], [-0.5]]  # two ragged rows
BASE: dict[str, Any] = {"per_token_logps": ROWS, "rewards": [1.0, 0.0]}
NO_GPU = not torch.cuda.is_available()


def body(**changes: Any) -> dict[str, Any]:
    """BASE with fields changed; a value of ... removes the field."""
    out = {**BASE, **changes}
    return {k: v for k, v in out.items() if v is not ...}


def raw(text: str) -> bytes:
    return text.encode()


def case(name: str, payload: Any, status: int, loc: list[Any], words: list[str], **kw: Any) -> Any:
    """One catalogue entry: a body, the status, where ``loc`` points, words the message holds."""
    return pytest.param(payload, status, loc, words, id=name, **kw)


CATALOGUE = [
    # shape of the rows
    case("missing-rows", body(per_token_logps=...), 422, ["body", "per_token_logps"], ["required"]),
    case("flat-rows", body(per_token_logps=[-1.0, -0.5]), 422, ["body", "per_token_logps", 0], ["list"]),
    case("extra-nested", body(per_token_logps=[[[-1.0]], [-0.5]]), 422, ["body", "per_token_logps", 0, 0], ["number"]),
    case("row-of-strings", body(per_token_logps=[["a"], [-0.5]]), 422, ["body", "per_token_logps", 0, 0], ["number"]),
    case("empty-batch", body(per_token_logps=[]), 422, ["body", "per_token_logps"], ["at least 1"]),
    case("empty-row", body(per_token_logps=[[], [-0.5]]), 422, ["body", "per_token_logps", 0], ["at least 1"]),
    # non-finite numbers (JSON's NaN/Infinity extensions, and a literal past float64)
    case(
        "nan",
        raw('{"per_token_logps": [[-1, NaN]], "rewards": [1]}'),
        422,
        ["body", "per_token_logps", 0, 1],
        ["finite"],
    ),
    case(
        "inf",
        raw('{"per_token_logps": [[Infinity]], "rewards": [1]}'),
        422,
        ["body", "per_token_logps", 0, 0],
        ["finite"],
    ),
    case(
        "-inf",
        raw('{"per_token_logps": [[-Infinity]], "rewards": [1]}'),
        422,
        ["body", "per_token_logps", 0, 0],
        ["finite"],
    ),
    case(
        "overflow",
        raw('{"per_token_logps": [[-1e999]], "rewards": [1]}'),
        422,
        ["body", "per_token_logps", 0, 0],
        ["finite"],
    ),
    case(
        "old-nan",
        raw('{"per_token_logps": [[-1]], "old_per_token_logps": [[NaN]], "rewards": [1]}'),
        422,
        ["body", "old_per_token_logps", 0, 0],
        ["finite"],
    ),
    case(
        "ref-inf",
        raw('{"per_token_logps": [[-1]], "ref_per_token_logps": [[-Infinity]], "rewards": [1]}'),
        422,
        ["body", "ref_per_token_logps", 0, 0],
        ["finite"],
    ),
    case("reward-nan", raw('{"per_token_logps": [[-1]], "rewards": [NaN]}'), 422, ["body", "rewards", 0], ["finite"]),
    case(
        "advantage-inf",
        raw('{"per_token_logps": [[-1]], "advantages": [Infinity]}'),
        422,
        ["body", "advantages", 0],
        ["finite"],
    ),
    case(
        "config-nan",
        raw('{"per_token_logps": [[-1]], "rewards": [1], "config": {"beta": NaN}}'),
        422,
        ["body", "config", "beta"],
        ["finite"],
    ),
    # positive log-probs: row 1, position 0
    case(
        "positive-logp",
        body(per_token_logps=[[-1.0, -2.0], [0.5]]),
        422,
        ["body", "per_token_logps", 1, 0],
        ["less than or equal to 0", "logits"],
    ),
    case(
        "positive-old",
        body(old_per_token_logps=[[-1.0, 2.0], [-0.5]]),
        422,
        ["body", "old_per_token_logps", 0, 1],
        ["less than or equal to 0"],
    ),
    case(
        "positive-ref",
        body(ref_per_token_logps=[[-1.0, -2.0], [3.0]]),
        422,
        ["body", "ref_per_token_logps", 1, 0],
        ["less than or equal to 0"],
    ),
    # old / ref / mask / entropies / tokens shaped unlike the current rows
    case(
        "old-row-length",
        body(old_per_token_logps=[[-1.0, -2.0], [-0.5, -0.1]]),
        422,
        ["body", "old_per_token_logps", 1],
        ["1 values like per_token_logps[1]", "got 2"],
    ),
    case(
        "old-row-count",
        body(old_per_token_logps=[[-1.0, -2.0]]),
        422,
        ["body", "old_per_token_logps"],
        ["2 rows like per_token_logps"],
    ),
    case(
        "ref-row-length",
        body(ref_per_token_logps=[[-1.0], [-0.5]]),
        422,
        ["body", "ref_per_token_logps", 0],
        ["2 values like per_token_logps[0]"],
    ),
    case("ref-empty-row", body(ref_per_token_logps=[[], [-0.5]]), 422, ["body", "ref_per_token_logps", 0], ["got 0"]),
    case(
        "mask-row-length",
        body(completion_mask=[[1, 1], [1, 0]]),
        422,
        ["body", "completion_mask", 1],
        ["1 values like per_token_logps[1]"],
    ),
    case("mask-row-count", body(completion_mask=[[1, 1], [1], [1]]), 422, ["body", "completion_mask"], ["2 rows"]),
    case("entropies-row-length", body(entropies=[[0.1], [0.2]]), 422, ["body", "entropies", 0], ["2 values"]),
    case("negative-entropy", body(entropies=[[0.1, -0.2], [0.2]]), 422, ["body", "entropies", 0, 1], ["greater than"]),
    case("tokens-row-length", body(tokens=[["a", "b"], ["c", "d"]]), 422, ["body", "tokens", 1], ["1 strings"]),
    case("tokens-row-count", body(tokens=[["a", "b"]]), 422, ["body", "tokens"], ["2 rows"]),
    # rewards and advantages
    case("rewards-length", body(rewards=[1.0, 0.0, 1.0]), 422, ["body", "rewards"], ["one number per row (2)"]),
    case(
        "advantages-length",
        body(rewards=..., advantages=[1.0]),
        422,
        ["body", "advantages"],
        ["one number per row (2)"],
    ),
    case("both", body(advantages=[1.0, -1.0]), 422, ["body", "advantages"], ["exactly one of advantages or rewards"]),
    case("neither", body(rewards=...), 422, ["body", "advantages"], ["exactly one of advantages or rewards"]),
    case("reward-string", body(rewards=["a", 0.0]), 422, ["body", "rewards", 0], ["number"]),
    # group size
    case("group-size-not-divisor", body(group_size=3), 422, ["body", "group_size"], ["divisor", "(2)"]),
    case("group-size-zero", body(group_size=0), 422, ["body", "group_size"], ["greater than or equal to 1"]),
    case("group-size-negative", body(group_size=-2), 422, ["body", "group_size"], ["greater than or equal to 1"]),
    case("group-size-fraction", body(group_size=1.5), 422, ["body", "group_size"], ["integer"]),
    # orjson reads an integer past 64 bits as a float: refused as no integer, before the library sees it
    case("group-size-huge", body(group_size=10**30), 422, ["body", "group_size"], ["integer"]),
    # mask values
    case(
        "mask-two",
        body(completion_mask=[[1, 2], [1]]),
        422,
        ["body", "completion_mask", 0, 1],
        ["less than or equal to 1"],
    ),
    case(
        "mask-negative", body(completion_mask=[[1, 1], [-1]]), 422, ["body", "completion_mask", 1, 0], ["greater than"]
    ),
    case("mask-half", body(completion_mask=[[1, 0.5], [1]]), 422, ["body", "completion_mask", 0, 1], ["integer"]),
    # prompt lengths and token_rows
    case("prompt-too-long", body(prompt_lengths=5), 422, ["body", "prompt_lengths", 0], ["from 0 to 2"]),
    case("prompt-negative", body(prompt_lengths=-1), 422, ["body", "prompt_lengths"], ["greater than or equal to 0"]),
    case("prompt-row-count", body(prompt_lengths=[0, 0, 0]), 422, ["body", "prompt_lengths"], ["2 ints"]),
    case("token-rows-out-of-range", body(token_rows=[0, 7]), 422, ["body", "token_rows", 1], ["below 2"]),
    case("token-rows-negative", body(token_rows=[-1]), 422, ["body", "token_rows", 0], ["greater than or equal to 0"]),
    # config values
    case("epsilon-low-negative", body(config={"epsilon_low": -0.1}), 422, ["body", "config", "epsilon_low"], [">= 0"]),
    case(
        "epsilon-high-negative", body(config={"epsilon_high": -0.1}), 422, ["body", "config", "epsilon_high"], [">= 0"]
    ),
    case("beta-negative", body(config={"beta": -0.01}), 422, ["body", "config", "beta"], [">= 0"]),
    case("dual-clip-below-one", body(config={"dual_clip": 0.5}), 422, ["body", "config", "dual_clip"], ["> 1"]),
    case("beta-string", body(config={"beta": "high"}), 422, ["body", "config", "beta"], ["number"]),
    case("beta-huge", body(config={"beta": 1e300}), 422, ["body", "config", "beta"], ["less than or equal"]),
    case(
        "epsilon-high-huge",
        body(config={"epsilon_high": 1e308}),
        422,
        ["body", "config", "epsilon_high"],
        ["less than or equal"],
    ),
    case(
        "max-completion-length-huge",  # past 64 bits: orjson reads a float, refused as no integer
        body(config={"max_completion_length": 10**30}),
        422,
        ["body", "config", "max_completion_length"],
        ["integer"],
    ),
    case(
        "max-completion-length-zero",
        body(config={"max_completion_length": 0}),
        422,
        ["body", "config", "max_completion_length"],
        [">= 1"],
    ),
    case(
        "unknown-config-field",
        body(config={"epsilon": 0.2}),
        422,
        ["body", "config", "epsilon"],
        ["LossConfig field", "epsilon_low"],
    ),
    case("config-not-an-object", body(config=[1]), 422, ["body", "config"], ["dictionary"]),
    # unknown presets and estimators list the valid ones
    case("unknown-preset", body(config={"preset": "ppo"}), 422, ["body", "config", "preset"], list(grpo.PRESETS)),
    case(
        "unknown-kl-estimator",
        body(config={"kl_estimator": "k4"}),
        422,
        ["body", "config", "kl_estimator"],
        list(grpo.KL_ESTIMATORS.names()),
    ),
    case(
        "unknown-objective",
        body(config={"objective": "ppo"}),
        422,
        ["body", "config", "objective"],
        list(grpo.OBJECTIVES.names()),
    ),
    case(
        "unknown-aggregation",
        body(config={"aggregation": "sum"}),
        422,
        ["body", "config", "aggregation"],
        list(grpo.AGGREGATIONS.names()),
    ),
    case(
        "unknown-advantage",
        body(config={"advantage": "leave-two-out"}),
        422,
        ["body", "config", "advantage"],
        list(grpo.ADVANTAGES.names()),
    ),
    case("unknown-dtype", body(config={"dtype": "float16"}), 422, ["body", "config", "dtype"], ["float32", "float64"]),
    case(
        "unknown-level",
        body(config={"importance_sampling_level": "row"}),
        422,
        ["body", "config", "importance_sampling_level"],
        ["token", "sequence"],
    ),
    # the device
    case(
        "cuda-without-gpu",
        body(config={"device": "cuda"}),
        422,
        ["body", "config", "device"],
        ["no CUDA GPU"],
        marks=pytest.mark.skipif(not NO_GPU, reason="this machine has a GPU"),
    ),
    case("unknown-device", body(config={"device": "tpu"}), 422, ["body", "config", "device"], ["cpu", "cuda"]),
    # bodies that are not a JSON object of the right fields
    case("not-json", raw("per_token_logps = [[-1]]"), 422, ["body"], ["JSON", "expected a JSON object"]),
    case("truncated-json", raw('{"per_token_logps": [[-1'), 422, ["body"], ["JSON"]),
    case("not-utf8", b"\xff\xfe\x00\x81{", 422, ["body"], ["expected a JSON object"]),
    case("empty-body", b"", 422, ["body"], ["required"]),
    case("nested-100k-deep", b"[" * 100_000 + b"]" * 100_000, 422, ["body"], ["expected a JSON object"]),
    case("int-5000-digits", raw('{"group_size": ' + "9" * 5000 + "}"), 422, ["body"], ["expected a JSON object"]),
    case("json-array", raw("[[-1.0]]"), 422, ["body"], ["dictionary or object"]),
    case("json-string", raw('"per_token_logps"'), 422, ["body"], ["dictionary or object"]),
    case("json-number", raw("3"), 422, ["body"], ["dictionary or object"]),
    case("json-null", raw("null"), 422, ["body"], ["dictionary or object"]),
    case("unknown-field", body(rewardz=[1.0, 0.0]), 422, ["body", "rewardz"], ["Extra inputs"]),
    case("alias-and-name", body(log_prob=ROWS), 422, ["body", "log_prob"], []),
]


@pytest.fixture(scope="module")
def api() -> TestClient:
    return client(raise_server_exceptions=False)


def send(api: TestClient, path: str, payload: Any) -> Any:
    if isinstance(payload, bytes):
        return api.post(path, content=payload, headers={"content-type": "application/json"})
    return api.post(path, json=payload)


@pytest.mark.parametrize(("payload", "status", "loc", "words"), CATALOGUE)
def test_bad_input_gets_a_4xx_that_says_where_and_what(
    api: TestClient, payload: Any, status: int, loc: list[Any], words: list[str]
) -> None:
    detail = error_detail(send(api, "/api/v1/loss", payload), status)
    first = detail[0]
    assert first["loc"][: len(loc)] == loc, detail
    for word in words:
        assert word in first["msg"], (word, first["msg"])
    assert api.post("/api/v1/loss", json=ARTICLE).status_code == 200  # and the next request is fine


# --- /api/v1/compare locates the config -----------------------------------------------------------
@pytest.mark.parametrize(
    ("configs", "loc", "words"),
    [
        ([], ["body", "configs"], ["at least 1"]),
        ([{}, {"beta": -1.0}], ["body", "configs", 1, "beta"], [">= 0"]),
        ([{"preset": "nope"}], ["body", "configs", 0, "preset"], list(grpo.PRESETS)),
        ([{}, {}, {"kl_estimator": "k9"}], ["body", "configs", 2, "kl_estimator"], ["k1", "k2", "k3"]),
        ([{}, {"foo": 1}], ["body", "configs", 1, "foo"], ["LossConfig field"]),
        pytest.param(
            [{}, {"device": "cuda"}],
            ["body", "configs", 1, "device"],
            ["no CUDA GPU"],
            marks=pytest.mark.skipif(not NO_GPU, reason="this machine has a GPU"),
        ),
    ],
)
def test_compare_errors_name_the_config(api: TestClient, configs: list[Any], loc: list[Any], words: list[str]) -> None:
    detail = error_detail(api.post("/api/v1/compare", json={**BASE, "configs": configs}), 422)
    assert detail[0]["loc"] == loc
    assert all(word in detail[0]["msg"] for word in words), detail[0]["msg"]


def test_compare_checks_the_batch_like_loss(api: TestClient) -> None:
    detail = error_detail(api.post("/api/v1/compare", json={**BASE, "rewards": [1.0], "configs": [{}]}), 422)
    assert detail[0]["loc"] == ["body", "rewards"]


# --- limits: 413 ------------------------------------------------------------------------------------
def test_limits_default_to_the_documented_values() -> None:
    settings = Settings()
    assert settings.max_body_bytes == 64 * 1024 * 1024
    assert settings.max_upload_bytes == 64 * 1024 * 1024
    assert settings.max_tokens == 4_194_304
    assert settings.full_token_limit == 65_536


def test_limits_are_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRPO_LENS_MAX_BODY_BYTES", "4096")
    monkeypatch.setenv("GRPO_LENS_MAX_TOKENS", "100")
    settings = Settings()
    assert (settings.max_body_bytes, settings.max_tokens) == (4096, 100)


def test_a_body_past_the_limit_gets_413(api: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(get_settings(), "max_body_bytes", 2048)
    big = {**BASE, "tokens": [["x" * 3000, "y"], ["z"]]}
    detail = error_detail(api.post("/api/v1/loss", json=big), 413)
    assert detail[0]["loc"] == ["body"] and "at most 2048 bytes" in detail[0]["msg"]
    assert api.post("/api/v1/loss", json=BASE).status_code == 200


def test_a_chunked_body_past_the_limit_gets_413(api: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """No Content-Length: the body is refused as soon as it passes the limit."""
    monkeypatch.setattr(get_settings(), "max_body_bytes", 2048)

    def chunks() -> Iterator[bytes]:
        yield b'{"per_token_logps": [[' + b"-1.0," * 1000
        yield b"-1.0]], " + b" " * 5000 + b'"rewards": [1.0]}'

    response = api.post("/api/v1/loss", content=chunks(), headers={"content-type": "application/json"})
    detail = error_detail(response, 413)
    assert "at most 2048 bytes" in detail[0]["msg"]


def test_the_limit_counts_padded_positions(api: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows of 2 and 1 tokens send 3 numbers but cost a 2 x 2 grid: the limit counts the 4 padded positions."""
    monkeypatch.setattr(get_settings(), "max_tokens", 3)
    detail = error_detail(api.post("/api/v1/loss", json=BASE), 413)
    assert detail[0]["loc"] == ["body", "per_token_logps"]
    assert "2 rows padded to the longest (2 positions): 4 positions; at most 3 padded positions" in detail[0]["msg"]
    detail = error_detail(api.post("/api/v1/compare", json={**BASE, "configs": [{}]}), 413)
    assert detail[0]["loc"] == ["body", "per_token_logps"]
    monkeypatch.setattr(get_settings(), "max_tokens", 4)
    assert api.post("/api/v1/loss", json=BASE).status_code == 200
    detail = error_detail(api.post("/api/v1/compare", json={**BASE, "configs": [{}, {}]}), 413)
    assert "4 positions x 2 configs; at most 4" in detail[0]["msg"]


def test_the_memory_estimate_is_checked_before_allocating(api: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """One row of 4,000 tokens and 4,000 one-token rows: a 66 KB body that would pad to 16 M positions."""
    hostile = {"per_token_logps": [[-1.0] * 4000] + [[-1.0]] * 4000, "advantages": [1.0] * 4001}
    detail = error_detail(api.post("/api/v1/loss", json=hostile), 413)
    assert "4001 rows padded to the longest (4000 positions): 16004000 positions" in detail[0]["msg"]
    monkeypatch.setattr(get_settings(), "max_request_bytes", 1024 * 1024)  # 1 MB: the article's 15 positions fit
    assert api.post("/api/v1/loss", json=ARTICLE).status_code == 200
    wide = {"per_token_logps": [[-1.0] * 8000], "advantages": [1.0]}  # 8,000 positions x ~180 bytes > 1 MB
    detail = error_detail(api.post("/api/v1/loss", json=wide), 413)
    assert "would take about 1 MB to compute; at most 1 MB per request" in detail[0]["msg"]


def test_too_many_compare_configs_gets_413(api: TestClient) -> None:
    many = get_settings().max_compare_configs + 1
    detail = error_detail(api.post("/api/v1/compare", json={**BASE, "configs": [{}] * many}), 413)
    assert detail[0]["loc"] == ["body", "configs"] and f"at most {many - 1}" in detail[0]["msg"]


# --- the error list stays short; a bug is a 500 that leaks nothing -----------------------------------
def test_a_million_bad_numbers_are_one_error(api: TestClient) -> None:
    """Lists stop at their first bad entry: one error, not a million (seconds and 100s of MB)."""
    detail = error_detail(api.post("/api/v1/loss", json={"per_token_logps": [[0.5] * 1_000_000], "rewards": [1]}), 422)
    assert [e["loc"] for e in detail] == [["body", "per_token_logps", 0, 0]]


def test_many_errors_are_capped(api: TestClient) -> None:
    """One bad value for every config field: at most MAX_ERRORS listed, then a count of the rest."""
    config = {name: [1] for name in grpo.FIELD_NAMES}
    detail = error_detail(api.post("/api/v1/loss", json={**BASE, "config": config}), 422)
    assert len(detail) == MAX_ERRORS + 1
    assert detail[-1]["type"] == "too_many_errors"
    assert f"{len(grpo.FIELD_NAMES) - MAX_ERRORS} more" in detail[-1]["msg"]


def test_an_internal_error_is_a_500_that_leaks_nothing(api: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("secret detail /etc/passwd")

    monkeypatch.setattr(grpo, "evaluate", broken)
    response = api.post("/api/v1/loss", json=BASE)
    detail = error_detail(response, 500)
    assert detail[0]["type"] == "internal" and "secret" not in response.text


def test_unknown_experiment_is_a_404_that_lists_the_valid_ones(api: TestClient) -> None:
    from grpo.experiments import EXPERIMENTS

    detail = error_detail(api.get("/api/v1/experiments/nope"), 404)
    assert detail[0]["loc"] == ["path", "name"]
    assert all(name in detail[0]["msg"] for name in EXPERIMENTS)


# Echoed input: a config value or an unknown field's name was echoed whole in the error (a 1 MB string
# gave a 1 MB answer, for aggregation, kl_estimator, rollout_correction and an unknown key). Now at most
# grpo.errors.SHOWN_CHARACTERS of it, with its length.
@pytest.mark.parametrize("field", ["aggregation", "kl_estimator", "rollout_correction", "preset", "unknown"])
def test_a_huge_config_value_is_named_not_echoed(field: str) -> None:
    huge = "x" * 1_000_000
    config = {huge: 1} if field == "unknown" else {field: huge}
    response = client().post("/api/v1/loss", json={**ARTICLE, "config": config})
    detail = error_detail(response, 422)
    assert len(response.content) < 4000, len(response.content)
    # the value (or its repr, with its quotes) cut, its length said; an unknown preset is named without it
    assert re.search(r"\.\.\. \(100000\d characters\)", str(detail)) or field == "preset", detail
