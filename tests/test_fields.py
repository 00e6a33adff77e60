"""grpo/fields.py: the batch-field table, everything derived from it, and the one ragged <-> padded converter.

The table is the one place a batch field is described: these tests hold that the readers, checks and
writers say what it says (nothing is written twice to drift), that the checks' errors still name the
field, the row, the position and what was expected, and that the converter matches a plain loop.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import grpo
from app.schemas import BatchRequest
from grpo import export, io, runs
from grpo.fields import ALIASES, BATCH_FIELDS, BatchField, fields_of, padded, present, ragged, register_field
from grpo.road import NAMES, PER_TOKEN, PLACEHOLDER


def test_every_reader_and_writer_takes_its_fields_from_the_table() -> None:
    assert list(BATCH_FIELDS) == [
        "per_token_logps",
        "old_per_token_logps",
        "ref_per_token_logps",
        "completion_mask",
        "tool_mask",
        "prompt_lengths",
        "advantages",
        "rewards",
        "token_level_rewards",
        "group_size",
        "entropies",
        "sampling_per_token_logps",
        "reward_weights",
        "reward_baselines",
        "sum_pi_squared",
    ]
    assert io.ALIASES is ALIASES and ALIASES["pi_old_logprob"] == "old_per_token_logps" and ALIASES["input_len"]
    assert set(PER_TOKEN) == set(fields_of("token")) == {*export.PER_TOKEN, "completion_mask"}
    assert ALIASES["env_mask"] == "tool_mask"  # TRL's name for it in a rollout function's extra fields
    assert export.PER_ROW == {
        "prompt_lengths": "prompt_length",
        "advantages": "advantage",
        "rewards": "reward",
        "reward_baselines": "reward_baseline",
    }
    assert {v: k for k, v in export.PER_ROW.items()} == io.ROW_KEYS
    assert set(runs.BATCH_TENSORS) == set(BATCH_FIELDS) - {"group_size", "reward_weights"}
    assert set(BatchRequest.model_fields) == {*BATCH_FIELDS, "tokens"}
    assert NAMES["completion_mask"] == ["completion_mask", "response_mask"]


def test_the_request_model_takes_every_alias_and_the_tables_bounds() -> None:
    request = BatchRequest.model_validate(
        {"log_prob": [[-1.0]], "response_mask": [[1]], "input_len": 0, "rewards": [1]}
    )
    assert request.batch_fields() == {
        "per_token_logps": [[-1.0]],
        "completion_mask": [[1]],
        "prompt_lengths": 0,
        "rewards": [1.0],
    }
    schema = BatchRequest.model_json_schema()["properties"]
    logp_value = schema["old_per_token_logps"]["anyOf"][0]["items"]["items"]
    assert logp_value == {"maximum": 0.0, "type": "number"}
    assert schema["group_size"]["anyOf"][0] == {"minimum": 1, "type": "integer"}
    assert "Aliases: old_log_prob, pi_old_logprob." in schema["old_per_token_logps"]["description"]


def test_each_placeholder_is_inside_its_fields_bounds() -> None:
    """The fast path validates the other fields with these in the per-token ones' place: an out-of-bounds
    placeholder would refuse every request."""
    for name, field in PER_TOKEN.items():
        (value,) = PLACEHOLDER[name][0]
        assert field.low <= value <= field.high, name


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        (
            "ref_per_token_logps",
            0.5,
            "ref_per_token_logps[1]: expected log-probs <= 0 (a positive value usually means logits were passed), "
            "got 0.5 at position 1",
        ),
        ("entropies", -0.25, "entropies[1]: expected entropies >= 0, got -0.25 at position 1"),
        (
            "old_per_token_logps",
            math.inf,
            "old_per_token_logps[1]: expected finite numbers at every counted token, got inf at position 1",
        ),
    ],
)
def test_the_checks_name_the_field_row_position_and_bound(name: str, value: float, expected: str) -> None:
    good = 0.5 if name == "entropies" else -1.0
    rows = [[good, good], [good, value]]
    with pytest.raises(grpo.GrpoInputError) as caught:
        grpo.from_rows([[-1.0, -1.0], [-1.0, -1.0]], advantages=[1.0, -1.0], **{name: rows})
    assert str(caught.value) == expected


def test_padding_may_hold_anything_and_is_zeroed() -> None:
    batch = grpo.Batch([[-1.0, 5.0]], entropies=[[0.5, float("nan")]], completion_mask=[[1, 0]], advantages=[1.0])
    assert batch.per_token_logps.tolist() == [[-1.0, 0.0]] and batch.entropies is not None
    assert batch.entropies.tolist() == [[0.5, 0.0]]
    assert batch.extra == {}


def test_a_field_outside_the_table_is_refused_by_name() -> None:
    with pytest.raises(grpo.GrpoInputError, match="toy: expected a batch field: one of per_token_logps"):
        grpo.Batch([[-1.0]], advantages=[1.0], toy=[[0.5]])


def test_bounds_in_words_follow_the_entry() -> None:
    assert BATCH_FIELDS["group_size"].bounds_text() == "group_size >= 1"
    assert BATCH_FIELDS["completion_mask"].bounds_text() == "only 0 and 1"
    unscored = BatchField("scores", "token", "float", "doc", low=0.0, high=1.0, nan_ok=True)
    assert unscored.bounds_text() == "scores >= 0 and <= 1"
    assert BATCH_FIELDS["rewards"].bounds_text() == "finite numbers"


def test_a_taken_name_or_alias_is_refused_and_nothing_is_registered() -> None:
    before = (dict(BATCH_FIELDS), dict(ALIASES))
    for taken in (BatchField("rewards", "row", "float", "again"), BatchField("x", "row", "float", "d", ("log_prob",))):
        with pytest.raises(ValueError, match="already taken"):
            register_field(taken)
    assert before == (BATCH_FIELDS, ALIASES)


def test_padded_and_ragged_match_a_plain_loop() -> None:
    rows = [[-1.0, -2.0, -3.0], [-4.0], [-5.0, -6.0]]
    lengths = [3, 1, 2]
    expected = np.zeros((3, 3))
    for i, row in enumerate(rows):
        for j, v in enumerate(row):
            expected[i, j] = v
    np.testing.assert_array_equal(padded("x", rows, lengths), expected)
    flat = np.array([v for row in rows for v in row])  # every row's values in order: the fast reader's arrays
    np.testing.assert_array_equal(padded("x", flat, lengths), expected)
    np.testing.assert_array_equal(padded("x", expected, lengths), expected)  # padded already: as it is
    np.testing.assert_array_equal(present(lengths), expected != 0)
    assert [r.tolist() for r in ragged(expected, lengths)] == rows
    assert [r.tolist() for r in ragged(torch.from_numpy(expected), lengths, rows=[2])] == [rows[2]]


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        ([[-1.0], [-1.0]], "x: expected 3 rows like per_token_logps, got 2 rows"),
        ([[-1.0], [-1.0, -2.0], [-1.0]], "x[1]: expected 1 values like per_token_logps[1], got 2"),
        ([[-1.0], ["a"], [-1.0]], "x[1]: expected a list of numbers"),
    ],
)
def test_padded_names_the_field_and_row_that_do_not_fit(rows: list[list[float]], expected: str) -> None:
    with pytest.raises(grpo.GrpoInputError) as caught:
        padded("x", rows, [1, 1, 1])
    assert str(caught.value) == expected
