"""grpo.aggregation: each aggregation's per-token weight by hand, TRL's and verl's row counts and
length epsilons, Dr. GRPO's constant."""

from __future__ import annotations

import pytest
import torch
from reference import close

import grpo
from grpo.aggregation import AGGREGATIONS

pytestmark = pytest.mark.numerical  # run again under ATEN_CPU_CAPABILITY=default by make test

# Three rows: lengths 2, 3 and 0 (fully masked), padded width 3.
MASK = torch.tensor([[1, 1, 0], [1, 1, 1], [0, 0, 0]], dtype=torch.float64)


def weights(name: str, **config: object) -> torch.Tensor:
    return AGGREGATIONS.get(name)(MASK, grpo.LossConfig(aggregation=name, **config), 3)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "config", "row_weights"),
    [
        # TRL grpo: (1/B) Σ_i Σ_t l / max(L_i, 1) over all B = 3 rows: 1/(3·2), 1/(3·3)
        ("seq-mean-token-mean", {}, [1 / 6, 1 / 9, 0]),
        # verl: only the 2 rows with a token, each L + 1e-8: 1/(2·(2 + 1e-8)), 1/(2·(3 + 1e-8))
        (
            "seq-mean-token-mean",
            {"skip_empty_rows": True, "length_epsilon": 1e-8},
            [1 / (2 * (2 + 1e-8)), 1 / (2 * (3 + 1e-8)), 0],
        ),
        # token mean over the 5 tokens, whatever the rows
        ("token-mean", {}, [1 / 5, 1 / 5, 0]),
        ("token-mean", {"skip_empty_rows": True}, [1 / 5, 1 / 5, 0]),
        # TRL luspo: (1/B) Σ_i Σ_t l; verl seq-mean-token-sum: / rows with a token
        ("seq-mean-token-sum", {}, [1 / 3, 1 / 3, 0]),
        ("seq-mean-token-sum", {"skip_empty_rows": True}, [1 / 2, 1 / 2, 0]),
        # Dr. GRPO: / (rows · C), C = max_completion_length, else the padded width 3
        ("seq-mean-token-sum-norm", {"max_completion_length": 512}, [1 / (3 * 512), 1 / (3 * 512), 0]),
        ("seq-mean-token-sum-norm", {"max_completion_length": None}, [1 / 9, 1 / 9, 0]),
        ("seq-mean-token-sum-norm", {"max_completion_length": None, "skip_empty_rows": True}, [1 / 6, 1 / 6, 0]),
    ],
)
def test_weights_by_hand(name: str, config: dict[str, object], row_weights: list[float]) -> None:
    expected = MASK * torch.tensor(row_weights, dtype=torch.float64)[:, None]
    close(weights(name, **config), expected)


def test_every_aggregation_has_a_hand_case() -> None:
    names = {"seq-mean-token-mean", "token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"}
    assert set(AGGREGATIONS.names()) == names


def test_mean_weights_sum_to_one() -> None:
    """Means are means: token-mean's weights sum to 1, and seq-mean-token-mean's too once empty rows
    are skipped (TRL's counts them, so its weights sum to (B - empty) / B)."""
    close(weights("token-mean").sum(), 1.0)
    close(weights("seq-mean-token-mean", skip_empty_rows=True).sum(), 1.0)
    close(weights("seq-mean-token-mean").sum(), 2 / 3)


def test_dr_grpo_constant_does_not_move_with_lengths() -> None:
    """Dr. GRPO's weight is one constant, whatever the rows' lengths; seq-mean-token-mean's is not."""
    w = weights("seq-mean-token-sum-norm", max_completion_length=512)
    assert w[MASK > 0].unique().tolist() == [1 / (3 * 512)]
    assert len(weights("seq-mean-token-mean")[MASK > 0].unique()) == 2


def test_all_masked_gives_zero_weights_not_nan() -> None:
    mask = torch.zeros(2, 3, dtype=torch.float64)
    for name in AGGREGATIONS.names():
        for skip in (False, True):
            w = AGGREGATIONS.get(name)(mask, grpo.LossConfig(aggregation=name, skip_empty_rows=skip), 3)
            assert (w == 0).all(), name


def test_weight_is_the_token_coefficient_in_evaluate(hand_batch: grpo.Batch) -> None:
    """loss = Σ weight · (-surrogate + beta·kl): the weight evaluate reports is the one it used."""
    for name in AGGREGATIONS.names():
        bd = grpo.evaluate(hand_batch, grpo.LossConfig(aggregation=name, beta=0.1, dtype="float64"))
        close(bd.tokens.loss, bd.tokens.weight * (-bd.tokens.surrogate + 0.1 * bd.tokens.kl))


def test_unknown_aggregation_lists_the_valid_names() -> None:
    with pytest.raises(grpo.GrpoInputError, match="seq-mean-token-mean, token-mean") as err:
        grpo.LossConfig(aggregation="sum")
    assert err.value.field == "aggregation"
