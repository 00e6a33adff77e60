"""grpo.io: every file format in, nothing unpickled or executed, and the breakdown out as JSON
(ragged like the input, row selection and the max_tokens limit)."""

from __future__ import annotations

import builtins
import io
import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import close

import grpo
import grpo.io
from grpo.answer import breakdown_to_json, dumps
from grpo.curves import objective_curves
from grpo.examples import ARTICLE_EXAMPLE
from grpo.explain import token_why
from grpo.glossary import metric_meanings
from grpo.io import ALIASES, load_file
from grpo.requests import batch_from_request, row_lengths

ROWS = {
    "per_token_logps": [[-1.0, -0.5], [-0.25, -2.0, -0.75]],
    "ref_per_token_logps": [[-1.1, -0.5], [-0.2, -2.0, -0.7]],
    "rewards": [1.0, 0.0],
}


class Payload:
    """Unpickling this calls open(path, "w"): it would create the file. Nothing may unpickle it."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (builtins.open, (self.path, "w"))


def test_payload_is_live(tmp_path: Path) -> None:
    """The control: plain pickle.loads does run the payload, so the refusals below mean something."""
    marker = tmp_path / "control"
    pickle.loads(pickle.dumps(Payload(marker))).close()
    assert marker.exists()


# --- reading --------------------------------------------------------------------------------------
def test_json_with_aliases() -> None:
    body = {"log_prob": ROWS["per_token_logps"], "ref_log_prob": ROWS["ref_per_token_logps"], "rewards": [1, 0]}
    request = load_file("batch.JSON", json.dumps(body).encode())
    assert set(request) == {"per_token_logps", "ref_per_token_logps", "rewards"}
    bd = grpo.evaluate(batch_from_request(request))
    assert bd.tokens.mask.tolist() == [[True, True, False], [True, True, True]]
    assert set(ALIASES.values()) <= set(grpo.batch.LOGP_FIELDS) | {"completion_mask", "tool_mask", "prompt_lengths"}


@pytest.mark.parametrize(
    ("name", "data", "match"),
    [
        ("b.json", b"{not json", "file: expected valid JSON"),
        ("b.json", b"[1, 2]", "file: expected a JSON object"),
        ("b.json", json.dumps({"log_prob": [[-1.0]], "per_token_logps": [[-1.0]]}).encode(), "not both"),
        ("b.csv", b"a,b", r"file: expected a .json, .jsonl, .safetensors, .npz or .pt file, got 'b.csv'"),
        ("b", b"{}", "file: expected a .json"),
        ("b.jsonl", b'{"per_token_logps": [-1.0]}\n[1]\n', r"file\[1\]: expected one JSON object per line"),
        (
            "b.jsonl",
            b'{"per_token_logps": [-1.0], "reward": 1}\n{"per_token_logps": [-1.0]}\n',
            "rewards: expected a value on every row line",
        ),
        ("b.safetensors", b"garbage", "file: expected a valid safetensors file"),
        ("b.npz", b"garbage", "file: expected an NPZ"),  # not a zip: numpy would unpickle it; refused
        ("b.pt", b"garbage", "file: expected a .pt file of plain tensors"),
    ],
)
def test_bad_files(name: str, data: bytes, match: str) -> None:
    with pytest.raises(grpo.GrpoInputError, match=match):
        load_file(name, data)


def test_jsonl_rows_and_batch_lines() -> None:
    lines = [
        {"config": {"preset": "verl-grpo"}, "group_size": 2},
        {"log_prob": [-1.0, -0.5], "reward": 1.0},
        {"log_prob": [-0.25, -2.0, -0.75], "reward": 0.0},
    ]
    request = load_file("rows.jsonl", "\n".join(json.dumps(x) for x in lines).encode() + b"\n\n")
    assert request["config"] == {"preset": "verl-grpo"} and request["group_size"] == 2
    assert request["per_token_logps"] == ROWS["per_token_logps"] and request["rewards"] == [1.0, 0.0]
    assert batch_from_request(request).shape == (2, 3)


def test_safetensors() -> None:
    from safetensors.torch import save

    tensors = {
        "old_log_prob": torch.tensor([[-1.0, -0.5], [-0.3, -0.2]]),
        "per_token_logps": torch.tensor([[-1.1, -0.4], [-0.3, -0.1]]),
        "response_mask": torch.tensor([[1, 1], [1, 0]]),
        "advantages": torch.tensor([0.5, -0.5]),
        "group_size": torch.tensor(2),
    }
    request = load_file("b.safetensors", save(tensors))
    assert request["group_size"] == 2 and np.asarray(request["advantages"]).tolist() == [0.5, -0.5]
    assert isinstance(request["old_per_token_logps"], np.ndarray)
    assert request["old_per_token_logps"].dtype == np.float32  # as stored: a float32 computation needs no copy
    bd = grpo.evaluate(batch_from_request(request), grpo.LossConfig(dtype="float64"))
    assert bd.tokens.mask.tolist() == [[True, True], [True, False]]
    close(bd.tokens.ratio[0], torch.tensor([-0.1, 0.1]).double().exp(), rtol=1e-6, atol=0)


def test_named_tensors_keep_the_widest_float() -> None:
    """float64 in any per-token field: every field float64, so none is rounded to another's precision;
    bf16 widens exactly to float32."""
    from safetensors.torch import save

    exact = torch.tensor([[-0.1234567890123, -1.0]], dtype=torch.float64)
    mixed = load_file("b.safetensors", save({"per_token_logps": exact.float(), "old_per_token_logps": exact}))
    assert mixed["per_token_logps"].dtype == mixed["old_per_token_logps"].dtype == np.float64
    assert mixed["old_per_token_logps"].tolist() == exact.tolist()
    half = load_file("b.safetensors", save({"per_token_logps": exact.bfloat16()}))
    assert half["per_token_logps"].dtype == np.float32
    assert half["per_token_logps"].tolist() == exact.bfloat16().float().tolist()
    assert half[grpo.io.INPUT_DTYPES] == {"per_token_logps": "bfloat16"}


def test_logits_file_goes_through_the_causal_shift() -> None:
    from safetensors.torch import save

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 7, generator=g)
    ids = torch.randint(0, 7, (2, 5), generator=g)
    data = save(
        {
            "logits": logits,
            "ref_logits": logits * 0.9,
            "token_ids": ids,
            "prompt_length": torch.tensor(2),
            "rewards": torch.tensor([1.0, 0.0]),
        }
    )
    request = load_file("b.safetensors", data)
    out = grpo.token_logprobs(logits, ids, 2, ref_logits=logits * 0.9)
    close(request["per_token_logps"], out.logps.double())
    close(request["ref_per_token_logps"], out.ref_logps.double())  # type: ignore[union-attr]
    close(request["entropies"], out.entropies.double())
    assert request["per_token_logps"].shape == (2, 3) and "full_kl" in request
    grpo.evaluate(batch_from_request(request))


def test_npz() -> None:
    buf = io.BytesIO()
    np.savez(
        buf,
        pi_logprob=np.array([[-1.0, -0.5], [-0.2, -0.1]]),
        rewards=np.array([1.0, 0.0]),
        input_len=np.array(1),  # 0-d arrays are scalars
        group_size=np.array(2),
    )
    request = load_file("b.npz", buf.getvalue())
    assert request["prompt_lengths"] == 1 and request["group_size"] == 2
    assert request["per_token_logps"].tolist() == [[-1.0, -0.5], [-0.2, -0.1]]
    assert batch_from_request(request).mask.tolist() == [[False, True], [False, True]]


def test_npz_object_arrays_are_refused_unopened(tmp_path: Path) -> None:
    marker = tmp_path / "npz-ran"
    buf = io.BytesIO()
    np.savez(buf, per_token_logps=np.array([Payload(marker)], dtype=object))
    with pytest.raises(grpo.GrpoInputError, match="object arrays need pickle and are refused"):
        load_file("b.npz", buf.getvalue())
    assert not marker.exists()
    buf = io.BytesIO()
    np.savez(buf, per_token_logps=np.array(["a", "b"]))
    with pytest.raises(grpo.GrpoInputError, match="per_token_logps: expected a numeric array"):
        load_file("b.npz", buf.getvalue())


def test_pt_plain_tensors() -> None:
    buf = io.BytesIO()
    torch.save(
        {"per_token_logps": torch.tensor([[-1.0, -0.5]]), "advantages": torch.tensor([1.0]), "group_size": 1}, buf
    )
    request = load_file("b.pt", buf.getvalue())
    assert request["group_size"] == 1 and request["advantages"] == [1.0]
    buf = io.BytesIO()
    torch.save([torch.zeros(1)], buf)
    with pytest.raises(grpo.GrpoInputError, match="a dict of named tensors"):
        load_file("b.pth", buf.getvalue())


@pytest.mark.parametrize("kind", ["torch.save", "raw pickle"])
def test_pt_malicious_pickle_is_refused_without_running(kind: str, tmp_path: Path) -> None:
    marker = tmp_path / "pt-ran"
    if kind == "torch.save":
        buf = io.BytesIO()
        torch.save({"per_token_logps": Payload(marker)}, buf)
        data = buf.getvalue()
    else:
        data = pickle.dumps({"per_token_logps": Payload(marker)}, protocol=2)
    with pytest.raises(grpo.GrpoInputError, match="weights_only=True"):
        load_file("evil.pt", data)
    assert not marker.exists()


# --- writing --------------------------------------------------------------------------------------
@pytest.fixture
def article() -> tuple[grpo.Breakdown, list[int]]:
    request = {k: v for k, v in ARTICLE_EXAMPLE.items() if k != "tokens"}
    return grpo.evaluate(batch_from_request(request)), row_lengths(request)


def test_json_round_trip(article: tuple[grpo.Breakdown, list[int]]) -> None:
    bd, lengths = article
    data = orjson.loads(dumps(breakdown_to_json(bd, lengths=lengths, tokens=ARTICLE_EXAMPLE["tokens"])))
    assert data["loss"] == float(bd.loss) and data["objective"] == float(bd.objective)
    assert data["metrics"] == pytest.approx(bd.metrics, rel=1e-12, abs=0)
    assert data["tokens_complete"] and data["token_rows"] == [0, 1, 2] and data["num_positions"] == 15
    tokens = data["tokens"]
    for name in ("ratio", "surrogate", "kl", "weight", "loss", "grad", "grad_policy", "grad_kl"):
        close(tokens[name], getattr(bd.tokens, name).double(), rtol=1e-7, atol=0)  # float32 printed shortest
    assert tokens["region"] == bd.tokens.region_names()
    assert tokens["mask"] == bd.tokens.mask.int().tolist()
    assert tokens["text"] == ARTICLE_EXAMPLE["tokens"]
    close(data["rows"]["loss"], bd.rows.loss.double(), rtol=1e-7, atol=0)
    assert data["rows"]["reward"] is None
    assert grpo.LossConfig(**data["config"]) == bd.config
    assert data["explanation"] and isinstance(data["warnings"], list)


def test_each_token_why_is_a_code_into_one_names_table_and_meanings_come_once(
    article: tuple[grpo.Breakdown, list[int]],
) -> None:
    """Before: tokens.why held a name string per token, metric meanings came twice (text and parts) and the
    clip view's numbers had float64's 17 digits: 137.6 KB per small answer (an 8 x 64 batch), 118.6 KB
    before the why and the meanings were added, 116.2 KB now."""
    bd, lengths = article
    data = orjson.loads(dumps(breakdown_to_json(bd, lengths=lengths)))
    why, names = data["tokens"]["why"], data["why"]["names"]
    assert all(isinstance(c, int) for row in why for c in row)
    expected = token_why(bd)
    assert names == list(expected.names)
    named = [[names[c] for c in row] for row in why]
    assert named == [row[:n] for row, n in zip(expected.code_names(), lengths, strict=True)]
    counts = data["why"]["counts"]
    assert counts == {name: sum(row.count(name) for row in named) for name in counts}
    # one copy of each metric's meaning: its parts, whose text joined is the library's sentence
    assert "metric_meanings" not in data
    meanings = metric_meanings(bd.config)
    for key, parts in data["metric_meaning_parts"].items():
        assert "".join(p if isinstance(p, str) else p["text"] for p in parts) == meanings[key], key
    # the clip view's numbers as float32 (to draw), the same curves and points to float32's precision
    curves, exact = data["curves"], objective_curves(bd)
    pairs = ((curves["x"], exact["x"]), (curves["positive"]["y"], exact["positive"]["y"]))
    for got, want in (*pairs, (curves["points"]["ratio"], exact["points"]["ratio"])):
        assert np.array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))  # shortest float32 text
    assert curves["points"]["sign"] == [int(s) for s in exact["points"]["sign"]]


def test_per_token_arrays_are_ragged_like_the_input() -> None:
    bd = grpo.evaluate(batch_from_request(ROWS))
    data = orjson.loads(dumps(breakdown_to_json(bd, lengths=row_lengths(ROWS))))
    for name in ("ratio", "grad", "region", "mask"):
        assert [len(r) for r in data["tokens"][name]] == [2, 3], name
    close(data["tokens"]["loss"][0], bd.tokens.loss[0, :2].double(), rtol=1e-7, atol=0)
    assert data["num_positions"] == 5


def test_max_tokens_and_row_selection(article: tuple[grpo.Breakdown, list[int]]) -> None:
    bd, lengths = article
    over = breakdown_to_json(bd, lengths=lengths, max_tokens=14)
    assert over["token_rows"] == [] and not over["tokens_complete"]
    assert all(v == [] for v in over["tokens"].values())
    assert len(over["rows"]["loss"]) == 3  # per-row data always comes whole
    assert breakdown_to_json(bd, lengths=lengths, max_tokens=15)["tokens_complete"]
    picked = orjson.loads(dumps(breakdown_to_json(bd, lengths=lengths, rows=[2], max_tokens=1)))
    assert picked["token_rows"] == [2] and not picked["tokens_complete"]
    close(picked["tokens"]["grad"], bd.tokens.grad[2:3].double(), rtol=1e-7, atol=0)


def test_dumps_writes_non_finite_as_null() -> None:
    assert orjson.loads(dumps({"a": float("nan"), "b": np.array([1.0, float("inf")], dtype=np.float32)})) == {
        "a": None,
        "b": [1.0, None],
    }


# --- read_arrays: JSON per-token fields straight into arrays ------------------------------------
NAMES = frozenset({"per_token_logps", "completion_mask"})


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(
        st.lists(st.floats(allow_nan=False, allow_infinity=False) | st.integers(-(2**53), 2**53), max_size=6),
        min_size=1,
        max_size=5,
    ),
    tokens=st.lists(st.lists(st.text(alphabet='[]{}ab"\\ ,é', max_size=4), max_size=3), max_size=3),
)
def test_read_arrays_agrees_with_orjson(rows: list[list[float]], tokens: list[list[str]]) -> None:
    """Whatever the numbers (ints, floats, subnormals, -0.0, shortest or long forms) and whatever the
    strings beside them hold ("[" included), the flat copy is exactly orjson's values, row by row."""
    text = orjson.dumps({"tokens": tokens, "per_token_logps": rows, "config": {"beta": [0.0]}})
    read = grpo.io.read_arrays(text, NAMES)
    assert read is not None
    rest, arrays = read
    assert rest == {"tokens": tokens, "config": {"beta": [0.0]}}
    flat, lengths = arrays["per_token_logps"]
    assert lengths.tolist() == [len(r) for r in rows]
    expected = np.array([float(x) for r in rows for x in r], dtype=np.float64)
    assert np.array_equal(flat.view(np.int64), expected.view(np.int64))  # bit for bit, -0.0 included


@pytest.mark.parametrize(
    "text",
    [
        b'{"per_token_logps": [[-1, [-2]]]}',  # deeper rows: the flat copy would flatten them
        b'{"per_token_logps": [[[-1]]]}',  # one-element nesting keeps the count: caught by the "[" count
        b'{"per_token_logps": [[-1.0], [[]]]}',
        b'{"per_token_logps": [-1.0, -2.0]}',  # a flat list
        b'{"per_token_logps": [[-1.0, "x"]]}',
        b'{"per_token_logps": [[-1.0, true]]}',
        b'{"per_token_logps": [[-1.0, null]]}',
        b'{"per_token_logps": [[1e400]]}',  # out of range: orjson's message names it
        b'{"per_token_logps": [[NaN]]}',  # Python's json reads it; the checks name it non-finite
        b'{"per_token_logps": [[-1.0]], "per_token_logps": [[-2.0]]}',  # duplicate keys: orjson keeps the last
        b'{"per_token_logps": [[-1.0]], "tokens": [["\\ud800"]]}',  # a lone surrogate: replaced by the exact reader
        b'{"per_token_logps": [[-1.0]], "tokens": [["\\u005b"]]}',  # an escaped "[": the count cannot prove the shape
        b'{"per_token_logps": [[-1.0]], "config": ' + b"[" * 2000 + b"]" * 2000 + b"}",
        b'[{"per_token_logps": [[-1.0]]}]',
        b'{"per_token_logps": [[-1.0]]} trailing',
        b'{"rewards": [1.0]}',  # no per-token field: nothing to gain
        b"",
    ],
)
def test_read_arrays_declines_what_it_cannot_prove(text: bytes) -> None:
    """None sends the text to the exact reader (parse_json), whose errors name the field and row."""
    assert grpo.io.read_arrays(text, NAMES) is None
