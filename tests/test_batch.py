"""grpo.batch: the counted mask, defaults, ragged rows, and every bad input raising GrpoInputError
(a ValueError) whose message names the tensor, the row and what was expected."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import torch

import grpo

NAN, INF = float("nan"), float("inf")
LOGP = [[-1.0, -2.0, -0.5], [-0.3, -0.7, -1.1]]


def fields(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"per_token_logps": LOGP, "advantages": [1.0, -1.0]}
    return {**base, **changes}


def raises(match: str, **changes: Any) -> grpo.GrpoInputError:
    with pytest.raises(grpo.GrpoInputError, match=match) as err:
        grpo.Batch(**fields(**changes))
    assert isinstance(err.value, ValueError)
    return err.value


# --- what counts ----------------------------------------------------------------------------------
def test_counted_mask_combines_completion_mask_and_prompt_lengths() -> None:
    batch = grpo.Batch(**fields(completion_mask=[[1, 1, 0], [1, 1, 1]], prompt_lengths=[1, 0]))
    assert batch.mask.tolist() == [[False, True, False], [True, True, True]]
    assert batch.mask_float.dtype == batch.logp.dtype
    # every position that does not count holds 0
    assert batch.logp.tolist() == [[0.0, -2.0, 0.0], [-0.3, -0.7, -1.1]]
    assert batch.prompt_length_tensor().tolist() == [1, 0]
    assert grpo.Batch(**fields(prompt_lengths=2)).mask.tolist() == [[False, False, True]] * 2
    assert grpo.Batch(**fields(prompt_lengths=np.int64(1))).prompt_length_tensor().tolist() == [1, 1]


def test_defaults_and_types() -> None:
    batch = grpo.Batch(**fields())
    assert batch.old_per_token_logps is None and batch.ref_per_token_logps is None  # on-policy, no reference
    assert batch.mask.all() and batch.shape == (2, 3)
    assert batch.logp.dtype == torch.float64  # lists become float64
    assert grpo.Batch(**fields(per_token_logps=np.array(LOGP, dtype=np.float32))).logp.dtype == torch.float64
    assert grpo.Batch(**fields(per_token_logps=torch.tensor(LOGP))).logp.dtype == torch.float32  # tensors keep theirs
    assert grpo.Batch(**fields(per_token_logps=[[-1, -2, 0], [0, -3, -1]])).logp.is_floating_point()
    assert isinstance(batch.advantages, torch.Tensor) and batch.advantages.dtype == torch.float64


def test_garbage_where_nothing_counts_is_accepted_and_zeroed() -> None:
    """Padding and prompt positions may hold NaN, inf or positive 'log-probs': they are zeroed."""
    logp = [[NAN, -2.0, INF], [5.0, -0.7, -INF]]
    batch = grpo.Batch(
        per_token_logps=logp,
        old_per_token_logps=logp,
        ref_per_token_logps=logp,
        completion_mask=[[1, 1, 0], [1, 1, 0]],
        prompt_lengths=1,
        advantages=[1.0, -1.0],
    )
    for t in (batch.logp, batch.old_per_token_logps, batch.ref_per_token_logps):
        assert isinstance(t, torch.Tensor)
        assert t.tolist() == [[0.0, -2.0, 0.0], [0.0, -0.7, 0.0]]


def test_from_rows_pads_ragged_rows() -> None:
    batch = grpo.from_rows(
        [[-1.0], [-0.5, -0.25, -2.0]], ref_per_token_logps=[[-1.5], [-0.5, -0.5, -1.0]], rewards=[1.0, 0.0]
    )
    assert batch.shape == (2, 3)
    assert batch.mask.tolist() == [[True, False, False], [True, True, True]]
    assert isinstance(batch.ref_per_token_logps, torch.Tensor)
    assert batch.ref_per_token_logps[0].tolist() == [-1.5, 0.0, 0.0]
    masked = grpo.from_rows([[-1.0, -2.0], [-0.5]], completion_mask=[[0, 1], [1]], advantages=[1.0, 1.0])
    assert masked.mask.tolist() == [[False, True], [True, False]]


# --- errors: each names the tensor, and the row where one is to blame ---------------------------------
def test_shape_mismatch() -> None:
    err = raises(
        r"old_per_token_logps: expected shape \(2, 3\) like per_token_logps, got shape \(2, 4\)",
        old_per_token_logps=[[-1.0] * 4] * 2,
    )
    assert err.field == "old_per_token_logps"
    raises(r"completion_mask: expected shape \(2, 3\)", completion_mask=[[1, 1]] * 2)
    raises(r"ref_per_token_logps: expected shape", ref_per_token_logps=[[-1.0] * 3])
    raises(r"entropies: expected shape", entropies=[[0.1] * 3])
    raises(r"per_token_logps: expected a non-empty 2-D array", per_token_logps=[-1.0, -2.0])
    raises(r"per_token_logps: expected a non-empty 2-D array", per_token_logps=np.zeros((0, 3)))
    raises(r"per_token_logps: expected a rectangular array", per_token_logps=[[-1.0, -2.0], [-1.0]])


@pytest.mark.parametrize("name", ["per_token_logps", "old_per_token_logps", "ref_per_token_logps"])
@pytest.mark.parametrize("bad", [NAN, INF, -INF])
def test_non_finite_at_a_counted_position(name: str, bad: float) -> None:
    values = [[-1.0, -2.0, -0.5], [-0.3, -0.7, -1.1]]
    values[1][2] = bad
    err = raises(
        rf"{name}\[1\]: expected finite numbers at every counted token, got {bad} at position 2", **{name: values}
    )
    assert (err.field, err.row) == (name, 1)


def test_positive_log_prob() -> None:
    err = raises(
        r"per_token_logps\[1\]: expected log-probs <= 0 .*logits.*got 0.3 at position 1",
        per_token_logps=[[-1.0, -2.0, -0.5], [-0.3, 0.3, -1.1]],
    )
    assert err.row == 1
    raises(r"ref_per_token_logps\[0\]: expected log-probs <= 0", ref_per_token_logps=[[2.0, -1.0, -1.0], [-1.0] * 3])
    raises(r"entropies\[0\]: expected entropies >= 0", entropies=[[0.1, -0.2, 0.0], [0.0] * 3])


@pytest.mark.parametrize("bad", [0.5, 2, -1, NAN])
def test_mask_other_than_zero_one(bad: float) -> None:
    err = raises(r"completion_mask\[1\]: expected only 0 and 1", completion_mask=[[1, 1, 1], [1, bad, 0]])
    assert err.row == 1


def test_rewards_and_advantages_both_or_neither() -> None:
    raises("exactly one of advantages or rewards", rewards=[1.0, 0.0])
    raises("exactly one of advantages or rewards", advantages=None)


def test_targets_shape_and_values() -> None:
    raises(r"advantages: expected one number per row \(2\), got shape \(3,\)", advantages=[1.0, 2.0, 3.0])
    err = raises(r"advantages\[1\]: expected finite numbers", advantages=[1.0, NAN])
    assert err.row == 1
    raises(r"rewards\[0\]: expected finite numbers", advantages=None, rewards=[INF, 0.0])


@pytest.mark.parametrize("G", [3, 0, -2, 1.5, True])
def test_group_size_must_divide_rows(G: Any) -> None:
    raises(
        r"group_size: expected a positive divisor of the number of rows \(2\)",
        advantages=None,
        rewards=[1.0, 0.0],
        group_size=G,
    )


def test_prompt_lengths() -> None:
    err = raises(r"prompt_lengths\[1\]: expected whole numbers from 0 to 3", prompt_lengths=[1, 4])
    assert err.row == 1
    raises(r"prompt_lengths\[0\]: expected whole numbers", prompt_lengths=[-1, 0])
    raises(r"prompt_lengths: expected an int or 2 ints", prompt_lengths=[1, 1, 1])


def test_complex_and_non_numeric() -> None:
    raises("per_token_logps: expected real numbers", per_token_logps=torch.zeros(2, 3, dtype=torch.complex64))
    raises("per_token_logps: expected a rectangular array of numbers", per_token_logps=[["a", "b", "c"]] * 2)


def test_from_rows_errors_name_the_row() -> None:
    with pytest.raises(grpo.GrpoInputError, match=r"per_token_logps\[1\]: expected at least one row"):
        grpo.from_rows([[-1.0], []], advantages=[1.0, 1.0])
    with pytest.raises(
        grpo.GrpoInputError, match=r"ref_per_token_logps\[1\]: expected 2 values like per_token_logps\[1\]"
    ):
        grpo.from_rows([[-1.0], [-1.0, -2.0]], ref_per_token_logps=[[-1.0], [-1.0]], advantages=[1.0, 1.0])
    with pytest.raises(grpo.GrpoInputError, match=r"old_per_token_logps: expected 2 rows"):
        grpo.from_rows([[-1.0], [-1.0]], old_per_token_logps=[[-1.0]], advantages=[1.0, 1.0])


def test_error_is_a_value_error_with_fields() -> None:
    err = grpo.GrpoInputError("beta", "a number >= 0", row=None, got="-1")
    assert isinstance(err, ValueError)
    assert str(err) == "beta: expected a number >= 0, got -1"
    assert str(grpo.GrpoInputError("x", "y", row=3)) == "x[3]: expected y"


def test_fields_are_tensors_after_construction_and_rebuild_the_same_batch() -> None:
    """The constructor converts lists, arrays and tensors alike; the fields it stores are tensors
    (the counted mask as bool, prompt lengths as int64), and a Batch rebuilt from them is equal."""
    batch = grpo.Batch(**fields(prompt_lengths=[1, 0], old_per_token_logps=np.array(LOGP), ref_per_token_logps=LOGP))
    for name in ("per_token_logps", "old_per_token_logps", "ref_per_token_logps", "advantages"):
        assert isinstance(getattr(batch, name), torch.Tensor), name
    assert batch.completion_mask.dtype == torch.bool and batch.prompt_lengths.dtype == torch.int64
    again = grpo.Batch(**{f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)})
    for f in dataclasses.fields(batch):
        a, b = getattr(batch, f.name), getattr(again, f.name)
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b), f.name
        else:
            assert a == b, f.name
