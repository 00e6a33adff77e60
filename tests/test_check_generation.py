"""TRL's sampling/* joined as TRL logs them: per generation batch, over the processes, over the logging window
(grpo.check.generation_metrics). Synthetic micro-batch results with hand-derived sums; the real-trainer check is
tests/test_capture_offpolicy.py."""

from __future__ import annotations

import math

import pytest

from grpo.check import MicroCheck, MicroResult, generation_metrics
from grpo.corrections import SAMPLING_METRICS, SamplingSums, sampling_over_ranks

MEAN, MAX, R_MIN, R_MEAN, R_MAX = SAMPLING_METRICS


def item(
    step: int, micro: int, rollout: tuple[int, int, int], sums: SamplingSums, rank: int | None = None
) -> MicroResult:
    check = MicroCheck(step, micro, rank, f"{step}-{micro}", None, 0.0, None, 1, {}, True)
    return MicroResult(check, {}, 1.0, 0.0, sums, rollout)


def sums(deltas: list[float], ratios: list[float]) -> SamplingSums:
    return SamplingSums(
        sum(deltas),
        len(deltas),
        max(deltas, default=-math.inf),
        sum(ratios),
        len(ratios),
        min(ratios, default=math.inf),
        max(ratios, default=-math.inf),
    )


def test_one_generation_over_two_micro_batches_is_one_batch() -> None:
    # micro 0: |delta| 0.1, 0.3; micro 1: 0.5 -> mean (0.1+0.3+0.5)/3 = 0.3, not the mean of means (0.2+0.5)/2
    by_step = {1: [item(1, 0, (1, 1, 2), sums([0.1, 0.3], [1.0, 2.0])), item(1, 1, (1, 1, 2), sums([0.5], [0.5]))]}
    got = generation_metrics(by_step, {"1": {}})[1]
    assert got[MEAN] == pytest.approx(0.3, rel=1e-15) and got[MAX] == 0.5
    assert (got[R_MIN], got[R_MEAN], got[R_MAX]) == (0.5, pytest.approx(3.5 / 3, rel=1e-15), 2.0)


def test_a_reused_rollout_logs_nothing_and_a_window_averages_its_generations() -> None:
    # GA 1, steps_per_generation 1, num_iterations 2: steps 1, 3 generate (rollouts 1, 2), steps 2, 4 reuse them
    by_step = {
        1: [item(1, 0, (1, 1, 1), sums([0.2], [1.0]))],
        2: [item(2, 0, (1, 2, 1), sums([9.0], [9.0]))],  # the second pass: TRL generates nothing, logs nothing
        3: [item(3, 0, (2, 1, 1), sums([0.4], [3.0]))],
        4: [item(4, 0, (2, 2, 1), sums([9.0], [9.0]))],
    }
    every_step = generation_metrics(by_step, {str(s): {} for s in range(1, 5)})
    assert set(every_step) == {1, 3} and every_step[3][MEAN] == 0.4
    # logging_steps 4: one log at step 4, the mean over the window's two generations
    window = generation_metrics(by_step, {"4": {}})
    assert window[4][MEAN] == pytest.approx(0.3, rel=1e-15) and window[4][R_MAX] == pytest.approx(2.0, rel=1e-15)


def test_an_uncaptured_micro_batch_or_step_leaves_the_step_unchecked() -> None:
    whole = [item(1, 0, (1, 1, 2), sums([0.1], [1.0])), item(1, 1, (1, 1, 2), sums([0.2], [1.0]))]
    assert generation_metrics({1: whole[:1]}, {"1": {}}) == {}  # half the generation batch: never guessed
    by_step = {2: [item(2, 0, (2, 1, 1), sums([0.1], [1.0]))]}  # step 1 of the window was not captured
    assert generation_metrics(by_step, {"2": {}}) == {}
    assert generation_metrics({1: whole}, {"1": {}}, incomplete=1) == {}  # a budget cut the step


def test_over_ranks_as_trl_gathers() -> None:
    # rank 0: deltas 0.1, 0.3 (mean 0.2), ratios 1, 3; rank 1: delta 0.6, ratio 0.5; TRL: gather(mean).mean(),
    # gather(max).max(), nanmin / nanmean / nanmax of the ratio's per-rank min / mean / max
    by_step = {
        1: [item(1, 0, (1, 1, 1), sums([0.1, 0.3], [1.0, 3.0]), 0), item(1, 0, (1, 1, 1), sums([0.6], [0.5]), 1)]
    }
    got = generation_metrics(by_step, {"1": {}})[1]
    assert got[MEAN] == pytest.approx(0.4, rel=1e-15) and got[MAX] == 0.6
    assert (got[R_MIN], got[R_MEAN], got[R_MAX]) == (0.5, pytest.approx(1.25, rel=1e-15), 3.0)
    # a rank that counted nothing reports 0 (TRL's empty case), and 0 takes part in the gathered mean and min
    empty = sampling_over_ranks([(sums([0.4], [2.0]) + SamplingSums()).metrics(), SamplingSums().metrics()])
    assert empty[MEAN] == 0.2 and empty[R_MIN] == 0.0 and empty[R_MEAN] == 1.0
