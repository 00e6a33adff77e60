"""The HTTP API through the ASGI client: the library's numbers unchanged, aliases, ragged per-token
arrays, the token limit, compare, options, experiments, health, docs and security headers.

Bad input is tests/test_api_errors.py; uploads tests/test_upload.py; a real socket tests/test_server.py.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Any

import numpy as np
import pytest
import torch
from api_fixtures import (
    ARTICLE,
    ARTICLE_NAMES,
    VERL_NAMES,
    assert_same_numbers,
    client,
    library,
    ragged_body,
)
from fastapi.testclient import TestClient

import grpo
from app.middleware import SECURITY_HEADERS
from app.settings import get_settings
from grpo.answer import TOKEN_FIELDS, dumps
from grpo.examples import ARTICLE_EXAMPLE
from grpo.experiments import EXPERIMENTS


@pytest.fixture(scope="module")
def api() -> TestClient:
    return client()


def post_loss(api: TestClient, body: dict[str, Any]) -> dict[str, Any]:
    response = api.post("/api/v1/loss", json=body)
    assert response.status_code == 200, response.text[:500]
    result: dict[str, Any] = response.json()
    return result


# --- the library's numbers, unchanged ------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("preset", list(grpo.PRESETS))
def test_loss_is_the_librarys_on_the_article_example(api: TestClient, preset: str, dtype: str) -> None:
    data = post_loss(api, {**ARTICLE, "config": {"preset": preset, "dtype": dtype}})
    assert_same_numbers(data, library(ARTICLE, preset, dtype=dtype), [5, 5, 5])


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize(
    ("preset", "overrides"),
    [
        ("article", {}),
        ("verl-grpo", {"beta": 0.05, "kl_estimator": "k2"}),
        ("trl-dr_grpo", {"advantage": "none", "max_completion_length": 16}),
        ("verl-gspo", {"dtype": "float64"}),
        ("trl-sapo", {}),
        ("trl-cispo", {"epsilon_high": 3.0}),
    ],
)
def test_loss_is_the_librarys_on_a_ragged_batch(
    api: TestClient, seed: int, preset: str, overrides: dict[str, Any]
) -> None:
    """Ragged rows, a mask with holes, per-row prompt lengths, rewards in groups, overrides."""
    body = ragged_body(seed)
    data = post_loss(api, {**body, "config": {"preset": preset, **overrides}})
    lengths = [len(r) for r in body["per_token_logps"]]
    assert_same_numbers(data, library(body, preset, **overrides), lengths)
    assert data["tokens"]["text"] == body["tokens"]
    assert data["num_positions"] == sum(lengths)


def test_the_article_example_gives_the_articles_loss(api: TestClient) -> None:
    """No config: the article's preset; the response echoes the fully resolved settings."""
    data = post_loss(api, ARTICLE_EXAMPLE)
    assert data["config"] == grpo.LossConfig.from_preset("article").to_dict()
    assert data["loss"] == pytest.approx(data["policy_loss"] + data["kl_loss"], rel=1e-6)
    assert data["objective"] == -data["loss"]
    assert data["tokens"]["text"] == ARTICLE_EXAMPLE["tokens"]
    # prompt_lengths 3 masks the first three positions of every row
    assert all(r[:3] == ["masked"] * 3 and "masked" not in r[3:] for r in data["tokens"]["region"])
    assert sum(sum(r) for r in data["tokens"]["loss"]) == pytest.approx(data["loss"], rel=1e-5)


def test_overrides_apply_over_the_preset_and_null_turns_a_clamp_off(api: TestClient) -> None:
    data = post_loss(api, {**ARTICLE, "config": {"preset": "verl-grpo", "beta": 0.3, "dual_clip": None}})
    assert data["config"]["preset"] == "verl-grpo"
    assert data["config"]["beta"] == 0.3
    assert data["config"]["dual_clip"] is None
    assert data["config"]["log_ratio_clamp"] == grpo.PRESETS["verl-grpo"].settings["log_ratio_clamp"]


def test_on_policy_defaults_and_the_response_says_so(api: TestClient) -> None:
    """old and ref default to the current log-probs: every ratio is 1 and the KL is 0."""
    data = post_loss(api, {"per_token_logps": [[-1.0, -2.0], [-0.5]], "rewards": [1.0, 0.0]})
    assert data["tokens"]["ratio"] == [[1.0, 1.0], [1.0]]
    assert data["tokens"]["kl"] == [[0.0, 0.0], [0.0]]
    assert data["kl_loss"] == 0.0
    warnings = " ".join(data["warnings"])
    assert "old_per_token_logps" in warnings and "ref_per_token_logps" in warnings


# --- aliases ---------------------------------------------------------------------------------------
def renamed(body: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    return {names.get(k, k): v for k, v in body.items()}


@pytest.mark.parametrize("names", [VERL_NAMES, ARTICLE_NAMES], ids=["verl", "article"])
def test_aliases_give_the_same_response(api: TestClient, names: dict[str, str]) -> None:
    body = {**ragged_body(3), "config": {"preset": "verl-grpo", "beta": 0.1}}
    aliased = renamed(body, names)
    assert set(aliased) != set(body)
    assert post_loss(api, aliased) == post_loss(api, body)


def test_article_names_on_the_article_example(api: TestClient) -> None:
    aliased = renamed(ARTICLE, ARTICLE_NAMES)
    assert "input_len" in aliased and "pi_logprob" in aliased
    assert post_loss(api, aliased)["loss"] == float(library(ARTICLE).loss)


# --- per-token arrays: ragged, and only on request past the token limit ---------------------------
def long_rows(*lengths: int) -> dict[str, Any]:
    return {"per_token_logps": [[-1.0] * n for n in lengths], "advantages": [1.0, -1.0][: len(lengths)]}


def test_per_token_arrays_are_ragged_like_the_input(api: TestClient) -> None:
    data = post_loss(api, {"per_token_logps": [[-1.0], [-0.5, -0.25, -2.0], [-3.0, -0.1]], "rewards": [1, 0, 2]})
    for name in (*TOKEN_FIELDS, "mask", "region"):
        assert [len(r) for r in data["tokens"][name]] == [1, 3, 2], name
    assert data["tokens_complete"] is True and data["token_rows"] == [0, 1, 2]
    assert [len(r) for r in data["tokens"]["mask"]] == [1, 3, 2]


def test_batches_up_to_the_token_limit_come_whole(api: TestClient) -> None:
    limit = get_settings().full_token_limit
    assert limit == 65_536
    data = post_loss(api, long_rows(limit // 2, limit // 2))
    assert data["tokens_complete"] is True
    assert [len(r) for r in data["tokens"]["loss"]] == [limit // 2, limit // 2]


def test_past_the_token_limit_only_summary_and_rows(api: TestClient) -> None:
    limit = get_settings().full_token_limit
    body = long_rows(limit // 2, limit // 2 + 1)
    data = post_loss(api, body)
    assert data["tokens_complete"] is False and data["token_rows"] == []
    assert all(data["tokens"][name] == [] for name in (*TOKEN_FIELDS, "mask", "region"))
    assert data["num_positions"] == limit + 1
    assert data["rows"]["length"] == [limit // 2, limit // 2 + 1]
    assert data["loss"] == float(library(body).loss)


def test_token_rows_names_the_rows_returned_in_full(api: TestClient) -> None:
    limit = get_settings().full_token_limit
    body = long_rows(limit // 2, limit // 2 + 1)
    data = post_loss(api, {**body, "token_rows": [1]})
    assert data["token_rows"] == [1] and data["tokens_complete"] is False
    assert [len(r) for r in data["tokens"]["grad"]] == [limit // 2 + 1]
    bd = library(body)
    np.testing.assert_array_equal(np.float32(data["tokens"]["grad"][0]), bd.tokens.grad[1].numpy())


# --- compare ---------------------------------------------------------------------------------------
def test_compare_gives_each_configs_loss(api: TestClient) -> None:
    body = ragged_body(5)
    configs = [{"preset": "article"}, {"preset": "verl-grpo", "beta": 0.1}, {"preset": "trl-dapo"}]
    response = api.post("/api/v1/compare", json={**body, "configs": configs})
    assert response.status_code == 200, response.text[:500]
    data = response.json()
    lengths = [len(r) for r in body["per_token_logps"]]
    assert data["lengths"] == lengths and data["text"] == body["tokens"]
    assert len(data["results"]) == len(configs)
    for result, config in zip(data["results"], configs, strict=True):
        single = post_loss(api, {**body, "config": config})
        assert result["loss"] == single["loss"] and result["metrics"] == single["metrics"]
        assert result["config"] == single["config"]
        assert set(result["tokens"]) == {"weight", "grad", "grad_policy", "grad_kl", "loss", "region"}
        assert result["tokens"]["grad"] == single["tokens"]["grad"]
        # the page's compare view finds the length sentence by its key, not its words (grpo.explain_items)
        assert result["explanation_keys"] == single["explanation_keys"]
        assert len(result["explanation_keys"]) == len(result["explanation"])
        length = result["explanation"][result["explanation_keys"].index("length")]
        assert length.startswith("Per token, the shortest row")


# --- options, experiments, health --------------------------------------------------------------------
@pytest.fixture(scope="module")
def options(api: TestClient) -> dict[str, Any]:
    response = api.get("/api/v1/options")
    assert response.status_code == 200
    result: dict[str, Any] = response.json()
    return result


def test_options_list_every_config_field(options: dict[str, Any]) -> None:
    assert [f["name"] for f in options["fields"]] == list(grpo.FIELD_NAMES)
    defaults = grpo.LossConfig()
    for field in options["fields"]:
        assert field["doc"], field["name"]
        assert field["default"] == getattr(defaults, field["name"])


def test_options_list_every_registry_entry(options: dict[str, Any]) -> None:
    assert set(options["registries"]) == set(grpo.REGISTRIES)
    for kind, registry in grpo.REGISTRIES.items():
        entries = options["registries"][kind]
        assert [e["name"] for e in entries] == list(registry.names())
        assert all(e["doc"] and e["paper"] for e in entries), kind
    choices = {f["name"]: f.get("choices") for f in options["fields"]}
    assert choices["objective"] == list(grpo.OBJECTIVES.names())
    assert choices["kl_estimator"] == list(grpo.KL_ESTIMATORS.names())
    assert choices["aggregation"] == list(grpo.AGGREGATIONS.names())
    assert choices["advantage"] == list(grpo.ADVANTAGES.names())


def test_options_list_every_preset_resolved(options: dict[str, Any]) -> None:
    assert [p["name"] for p in options["presets"]] == list(grpo.PRESETS)
    for preset in options["presets"]:
        assert preset["doc"] and preset["source"]
        assert preset["config"] == grpo.LossConfig.from_preset(preset["name"]).to_dict()
    assert options["regions"] == list(grpo.REGIONS)


def test_experiments_list(api: TestClient) -> None:
    response = api.get("/api/v1/experiments")
    assert response.status_code == 200
    listed = response.json()
    assert [e["name"] for e in listed] == list(EXPERIMENTS)
    assert all(e["title"] and e["article"] for e in listed)


@pytest.mark.parametrize("name", list(EXPERIMENTS))
def test_each_experiment_is_the_librarys(api: TestClient, name: str) -> None:
    response = api.get(f"/api/v1/experiments/{name}")
    assert response.status_code == 200
    assert response.json() == json.loads(dumps(dataclasses.asdict(EXPERIMENTS[name]())))


def test_healthz(api: TestClient) -> None:
    response = api.get("/healthz")
    assert response.status_code == 200
    data = response.json()
    assert data["status"] == "ok" and data["torch"] == torch.__version__
    assert data["cuda_available"] is torch.cuda.is_available()
    assert data["device"] == ("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_gives_the_cpu_numbers(api: TestClient) -> None:  # pragma: no cover - GPU machines only
    cpu = post_loss(api, {**ARTICLE, "config": {"device": "cpu", "dtype": "float64"}})
    cuda = post_loss(api, {**ARTICLE, "config": {"device": "cuda", "dtype": "float64"}})
    assert cuda["device"].startswith("cuda")
    assert cuda["loss"] == pytest.approx(cpu["loss"], rel=1e-12)


# --- OpenAPI, /docs, security headers ---------------------------------------------------------------
def test_openapi_lists_every_route(api: TestClient) -> None:
    schema = api.get("/openapi.json").json()
    assert set(schema["paths"]) == {
        "/api/v1/loss",
        "/api/v1/compare",
        "/api/v1/upload",
        "/api/v1/export/{fmt}",
        "/api/v1/examples/{fmt}",
        "/api/v1/options",
        "/api/v1/experiments",
        "/api/v1/experiments/{name}",
        "/api/v1/runs",
        "/api/v1/runs/{run}",
        "/api/v1/runs/{run}/steps/{step}",
        "/api/v1/runs/{run}/download",
        "/api/v1/runs/{run}/replay",
        "/api/v1/runs/{run}/timeline",
        "/api/v1/runs/{run}/events",
        "/healthz",
        "/api/v1/lab/tasks",
        "/api/v1/lab/runs",
        "/api/v1/lab/queue",
        "/api/v1/lab/runs/{run_id}",
        "/api/v1/lab/runs/{run_id}/status",
        "/api/v1/lab/runs/{run_id}/events",
        "/api/v1/lab/runs/{run_id}/steps/{step}",
    }
    loss = schema["paths"]["/api/v1/loss"]["post"]
    assert {"200", "413", "422"} <= set(loss["responses"])
    assert loss["responses"]["200"]["content"]["application/json"]["schema"] != {"type": "string"}
    props = schema["components"]["schemas"]["LossRequest"]["properties"]
    assert {"per_token_logps", "old_per_token_logps", "rewards", "advantages", "config", "token_rows"} <= set(props)


ASSET = re.compile(r"""<(?:script|link|img)\b[^>]*?\b(?:src|href)="([^"]*)\"""")


@pytest.mark.parametrize("page", ["/docs", "/"])
def test_pages_load_only_local_assets(api: TestClient, page: str) -> None:
    response = api.get(page)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
    assets = ASSET.findall(response.text)
    assert assets, "no scripts or styles found"
    for url in assets:
        if url.startswith("data:"):
            continue
        assert url.startswith("/") and not url.startswith("//"), url  # same origin, no CDN
        assert api.get(url).status_code == 200, url


@pytest.mark.parametrize("page", ["/docs", "/"])
def test_pages_fit_the_content_security_policy(api: TestClient, page: str) -> None:
    """script-src 'self': no inline script and no inline event handler in the HTML."""
    html = api.get(page).text
    # a JSON data block (the dashboard's options and first answer) is data the browser never runs
    assert not re.search(r"<script\b(?![^>]*\bsrc=)(?![^>]*type=\"application/json\")[^>]*>\s*\S", html), (
        "inline <script>"
    )
    assert not re.search(r"\son[a-z]+\s*=", html, re.I), "inline event handler"
    assert "javascript:" not in html.lower()
    csp = api.get(page).headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-eval" not in csp and "default-src 'self'" in csp


BOOT = re.compile(r'<script type="application/json" id="boot">(.*?)</script>', re.S)


def test_the_page_carries_the_options_and_the_first_answer(api: TestClient) -> None:
    """The dashboard's boot block: the options, and the /api/v1/loss answer to the request the page
    sends first for the link's scenario and settings (display-only parameters ignored)."""
    boot = json.loads(BOOT.search(api.get("/?scenario=article&preset=verl-grpo&beta=0.5&row=1").text).group(1))
    assert boot["options"] == api.get("/api/v1/options").json()
    request = {**grpo.examples.SCENARIOS["article"].request, "config": {"preset": "verl-grpo", "beta": 0.5}}
    assert boot["first"]["request"] == request
    assert boot["first"]["answer"] == api.post("/api/v1/loss", json=request).json()
    # an edited batch (only the page decodes it) or an unknown parameter: the page asks the API itself
    for query in ("?input=e30", "?preset=article&beta=oops", "?no_such_field=1"):
        assert json.loads(BOOT.search(api.get("/" + query).text).group(1))["first"] is None, query


def test_a_grid_wider_than_the_heatmap_is_pooled(api: TestClient) -> None:
    """Past HEATMAP_MAX_TOKENS positions the heatmaps come pooled: each block's counted token farthest
    from the field's centre, the same numbers as the per-token arrays pooled by grpo.pooling."""
    from grpo.answer import HEATMAP_CENTERS, HEATMAP_MAX_TOKENS
    from grpo.pooling import pool_extreme

    assert api.post("/api/v1/loss", json=ARTICLE).json()["heatmap"] is None  # small: drawn cell by cell
    width = 2 * HEATMAP_MAX_TOKENS + 100  # -> blocks of 3 positions
    g = torch.Generator().manual_seed(3)
    old = (-torch.rand(2, width, generator=g) * 2 - 0.01).tolist()
    new = (torch.tensor(old) + 0.3 * torch.randn(2, width, generator=g)).clamp(max=0).tolist()
    mask = [[1] * width, [1] * (width - 7) + [0] * 7]
    body = {"per_token_logps": new, "old_per_token_logps": old, "completion_mask": mask, "rewards": [1.0, 0.0]}
    data = api.post("/api/v1/loss", json=body).json()
    pooled = data["heatmap"]
    assert (pooled["factor_rows"], pooled["factor_tokens"]) == (1, 3)
    counted = torch.tensor(data["tokens"]["mask"], dtype=torch.bool)
    for field, center in HEATMAP_CENTERS.items():
        want = pool_extreme(torch.tensor(data["tokens"][field], dtype=torch.float64), counted, 1, 3, center)
        got = [[math.nan if v is None else v for v in row] for row in pooled["fields"][field]]
        got = torch.tensor(got, dtype=torch.float32)  # float32's shortest form reads back exactly
        # chosen, not computed: each cell is its block's token, as float32 (numbers to draw)
        torch.testing.assert_close(got, want.values.float(), equal_nan=True, rtol=0, atol=0)
    # row 1 counts positions 0..1292: block 430 (1290-1292) holds 3, blocks 431-433 (1293-1299) none
    assert pooled["counted"][1][-4:] == [3, 0, 0, 0] and pooled["fields"]["kl"][1][-3:] == [None] * 3
    assert (pooled["rows"], pooled["width"]) == ([0, 1], width)


def test_heatmap_rows_all_covers_every_row_past_the_token_limit(api: TestClient) -> None:
    """heatmap_rows "all" (the page's): one row's tokens (or none) in the answer, but the heatmaps' grid
    covers the whole batch, pooled from the breakdown by grpo.pooling where its cells outnumber the
    heatmap's pixels. "shown" (the default): the grid covers the rows whose tokens come."""
    from grpo.answer import HEATMAP_CENTERS, HEATMAP_MAX_ROWS, HEATMAP_MAX_TOKENS
    from grpo.pooling import pool_extreme, pool_factors

    limit = get_settings().full_token_limit
    body = long_rows(limit // 2, limit // 2 + 1)
    bd = library(body)
    fr, ft = pool_factors(2, limit // 2 + 1, HEATMAP_MAX_ROWS, HEATMAP_MAX_TOKENS)
    assert (fr, ft) == (1, 55)
    for extra in ({}, {"token_rows": [1]}):
        data = post_loss(api, {**body, **extra, "heatmap_rows": "all"})
        pooled = data["heatmap"]
        shape = (pooled["rows"], pooled["width"], pooled["factor_rows"], pooled["factor_tokens"])
        assert shape == ([0, 1], limit // 2 + 1, 1, 55)
        for field, center in HEATMAP_CENTERS.items():
            want = pool_extreme(getattr(bd.tokens, field), bd.tokens.mask, fr, ft, center).values.float()
            got = torch.tensor([[math.nan if v is None else v for v in r] for r in pooled["fields"][field]])
            torch.testing.assert_close(got, want, equal_nan=True, rtol=0, atol=0)
    assert post_loss(api, body)["heatmap"] is None  # "shown": no rows' tokens, no grid
    shown = post_loss(api, {**body, "token_rows": [1]})["heatmap"]
    assert (shown["rows"], shown["width"], shown["factor_tokens"]) == ([1], limit // 2 + 1, 55)
    # a small batch whose tokens come for one row only: with "all", its whole grid cell by cell
    data = post_loss(api, {**ARTICLE, "token_rows": [2], "heatmap_rows": "all"})
    pooled = data["heatmap"]
    assert (pooled["rows"], pooled["factor_rows"], pooled["factor_tokens"]) == ([0, 1, 2], 1, 1)
    assert len(pooled["fields"]["loss"]) == 3 and data["token_rows"] == [2]
    assert post_loss(api, {**ARTICLE, "heatmap_rows": "all"})["heatmap"] is None  # drawn from the tokens
    error = api.post("/api/v1/loss", json={**ARTICLE, "heatmap_rows": "every"})
    assert error.status_code == 422 and error.json()["detail"][0]["loc"] == ["body", "heatmap_rows"]


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/", None),
        ("GET", "/docs", None),
        ("GET", "/openapi.json", None),
        ("GET", "/healthz", None),
        ("GET", "/api/v1/options", None),
        ("GET", "/static/js/main.js", None),
        ("GET", "/vendor/plotly.min.js", None),
        ("GET", "/no/such/page", None),
        ("GET", "/api/v1/experiments/nope", None),
        ("POST", "/api/v1/loss", ARTICLE),
        ("POST", "/api/v1/loss", {"per_token_logps": [[1.0]], "rewards": [1.0]}),
        ("DELETE", "/api/v1/loss", None),
    ],
)
def test_security_headers_on_every_response(api: TestClient, method: str, path: str, body: Any) -> None:
    response = api.request(method, path, json=body)
    for name, value in SECURITY_HEADERS:
        assert response.headers[name.decode()] == value.decode(), (path, name)
    assert response.headers["x-content-type-options"] == "nosniff"
