"""grpo.explain and python -m grpo: the sentences say what the numbers say; the CLI prints the
breakdown of the article's example or of a file."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
import torch
from reference import HAND, close, evaluate64

import grpo
import grpo.explain
from grpo.__main__ import main
from grpo.corrections import KEPT, MASKED, REJECTED, SEQUENCE_MASKED, TRUNCATED
from grpo.examples import ARTICLE_EXAMPLE, SCENARIOS
from grpo.explain import explain, explain_items, summary_table, token_why
from grpo.loss import Breakdown
from grpo.requests import batch_from_request


def test_positive_loss_from_a_negative_surrogate(hand_batch: grpo.Batch) -> None:
    # article on the hand batch: surrogate 2.1/4 - 5.9/6 = -0.4583 < 0, beta·KL 0.0011: loss 0.4594 > 0
    bd = evaluate64(hand_batch, "article")
    first = explain(bd)[0]
    assert first.startswith("The loss is positive (0.4594)") and "-0.4583" in first
    assert any(s.startswith("2 of 5 tokens get no policy gradient") for s in explain(bd))


def test_negative_loss_sentence() -> None:
    # every advantage +1 on the hand batch, token mean: min(r, clip(r)) = 1.2, 0.9, 0.5 (r = 0.5 is below
    # the trust region, and A > 0 keeps the lower), 1.1, 1.2: surrogate 4.9 / 5 = 0.98 > 0 = beta·KL
    bd = evaluate64(grpo.Batch(**{**HAND, "advantages": [1.0, 1.0]}), "trl-dapo")
    close(bd.loss, -0.98)
    assert explain(bd)[0].startswith(
        "The loss is negative (-0.98) because the weighted surrogate 0.98 exceeds beta·KL 0."
    )
    assert "beta = 0: the KL term is off, so the loss is the policy term alone." in explain(bd)


def test_on_policy_sentences() -> None:
    request = {"per_token_logps": [[-1.0, -2.0], [-0.5, -0.25]], "rewards": [1.0, 0.0]}
    bd = grpo.evaluate(batch_from_request(request), grpo.LossConfig(beta=0.0, dtype="float64"))
    sentences = explain(bd)
    assert sentences[0].startswith("The loss is about 0")
    assert any("The ratio is 1 everywhere (on-policy)" in s and "gradient norm" in s for s in sentences)


def test_zero_std_sentence() -> None:
    request = {"per_token_logps": [[-1.0], [-0.5]], "ref_per_token_logps": [[-1.2], [-0.4]], "rewards": [1.0, 1.0]}
    bd = grpo.evaluate(batch_from_request(request))
    assert any(s.startswith("1 group(s) have zero reward std (frac_reward_zero_std = 1)") for s in explain(bd))


def test_summary_table(hand_batch: grpo.Batch) -> None:
    bd = evaluate64(hand_batch, "verl-grpo")
    text = summary_table(bd)
    assert "preset verl-grpo" in text and f"{float(bd.loss): .6g}" in text
    assert "actor/pg_clipfrac_lower" in text
    assert len([line for line in text.splitlines() if line.startswith("    0  ") or line.startswith("    1  ")]) == 2


# --- python -m grpo ---------------------------------------------------------------------------------
def test_cli_article(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    out = capsys.readouterr().out
    bd = grpo.evaluate(batch_from_request(ARTICLE_EXAMPLE), grpo.LossConfig.from_preset("article"))
    assert "preset article" in out and f"{float(bd.loss): .6g}" in out


def test_cli_eval_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "batch.json"
    path.write_text(json.dumps({**ARTICLE_EXAMPLE, "config": {"preset": "trl-grpo", "beta": 0.04}}))
    assert main(["eval", str(path), "--json", "--set", "epsilon_high=0.28"]) == 0
    data = orjson.loads(capsys.readouterr().out)
    assert data["config"]["preset"] == "trl-grpo" and data["config"]["beta"] == 0.04
    assert data["config"]["epsilon_high"] == 0.28
    config = grpo.LossConfig.from_preset("trl-grpo", beta=0.04, epsilon_high=0.28)
    expected = grpo.evaluate(batch_from_request(ARTICLE_EXAMPLE), config)
    assert data["loss"] == float(expected.loss)
    assert data["tokens"]["text"] == ARTICLE_EXAMPLE["tokens"]
    assert main(["eval", str(path), "--preset", "verl-dapo"]) == 0
    assert "preset verl-dapo" in capsys.readouterr().out


def test_cli_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"per_token_logps": [[-1.0, 0.5]], "advantages": [1.0]}))
    assert main(["eval", str(bad)]) == 2
    assert "per_token_logps[0]: expected log-probs <= 0" in capsys.readouterr().err
    assert main(["eval", str(tmp_path / "missing.json")]) == 2
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"per_token_logps": [[-1.0]], "advantages": [1.0]}))
    assert main(["eval", str(good), "--set", "beta=-1"]) == 2
    assert "beta: expected a number >= 0.0" in capsys.readouterr().err


# --- every sentence holds for the batch it describes --------------------------------------------------
# Each sentence explain() can produce has a pattern here and a check of its numbers against the
# Breakdown; a sentence that matches no pattern fails the test. Numbers are printed with 4 (the
# "about 0" sentence: 3) significant digits, so they agree with the value to 5e-4 (5e-3) relative.


def _num(text: str, value: float, digits: int = 4) -> None:
    assert float(text) == pytest.approx(value, rel=5 * 10.0 ** (-digits) + 1e-9, abs=1e-12), (text, value)


def _parts(bd: Breakdown) -> tuple[float, float, float, float]:
    """loss, weighted surrogate S = -policy_loss, beta·KL K, and the size of the per-token terms."""
    size = float(bd.tokens.policy_loss.abs().sum() + bd.tokens.kl_loss.abs().sum())
    return float(bd.loss), -float(bd.policy_loss), float(bd.kl_loss), size


def _counted(bd: Breakdown) -> torch.Tensor:
    return bd.tokens.mask.bool()


def _sign(bd: Breakdown, m: re.Match[str]) -> None:
    loss, s, k, size = _parts(bd)
    text = m.group(0)
    if text.startswith("The loss is about 0"):
        _num(m["a"], loss, 3)
        _num(m["b"], size)
        _num(m["c"], s)
        _num(m["d"], k)
        assert abs(loss) <= 1e-5 * size
        return
    _num(m["a"], loss)
    if text.startswith("The loss is negative"):
        assert loss < 0 and s > k
        _num(m["b"], s)
        _num(m["c"], k)
        assert ("itself negative" in text) == (k < 0)
        drivers = re.findall(r"row (\d+) \((\S+)\)", text)
        shares = sorted((float(v), i) for i, v in enumerate(bd.rows.loss.tolist()) if v < 0)
        assert [int(i) for i, _ in drivers] == [i for _, i in shares[: len(drivers)]]
        for i, v in drivers:
            _num(v, float(bd.rows.loss[int(i)]))
        rose = re.search(r"(\d+) token\(s\) with A > 0 have a ratio above 1 \(up to (\S+)\)", text)
        a = bd.advantages[:, None].expand_as(bd.tokens.ratio)
        up = _counted(bd) & (a > 0) & (bd.tokens.ratio > 1)
        assert (rose is not None) == bool(up.any())
        if rose:
            assert int(rose[1]) == int(up.sum())
            _num(rose[2], float(bd.tokens.ratio[up].max()))
        return
    assert loss > 0
    if "every policy term is 0" in text:
        assert float(bd.tokens.policy_loss.abs().max()) == 0
    elif "the policy terms cancel" in text:
        _num(m["b"], s, 3)
        _num(m["d"], k)
        assert abs(s) <= 1e-5 * float(bd.tokens.policy_loss.abs().sum())
    elif "because beta·KL" in text:
        _num(m["b"], k)
        _num(m["c"], s)
        assert k > s > 0
    elif "mostly from beta·KL" in text:
        _num(m["b"], k)
        _num(m["c"], s)
        assert s < 0 < k and k > -s
    else:  # the surrogate is itself negative
        _num(m["b"], s)
        _num(m["c"], k)
        assert s < 0 and k <= -s


def _on_policy(bd: Breakdown, m: re.Match[str]) -> None:
    ratios = bd.tokens.ratio[_counted(bd)]
    assert bool((ratios == 1).all())
    _num(m[1], float(bd.policy_loss))
    # on-policy only without the sampler's log-probs; each A times its weight where a correction acted
    assert ("the sampler's log-probs differ" in m[0]) == bd.sampled
    t = bd.tokens
    dropped = (t.correction == MASKED) | (t.correction == SEQUENCE_MASKED) | (t.correction == REJECTED)
    corrected = bool((((t.is_weight != 1) & t.mask) | dropped).any())
    assert ("rollout-correction weight" in m[0]) == corrected
    loss, _, _, size = _parts(bd)
    grad_norm = bd.metrics.get("lens/grad_norm_logps", bd.metrics.get("grad_norm", 0.0))
    assert (m[2] is not None) == (abs(loss) <= 0.01 * size and grad_norm > 0)
    if m[2]:
        _num(m[3], grad_norm)


def _flat(bd: Breakdown, m: re.Match[str]) -> None:
    why = token_why(bd)
    silent = torch.zeros_like(_counted(bd))
    for name in why.no_gradient:
        silent |= why.codes == why.names.index(name)
    assert int(m[1]) == int(silent.sum()) and int(m[2]) == int(_counted(bd).sum())
    assert float(bd.tokens.grad_policy[silent].abs().max()) == 0  # "get no policy gradient"
    code_of = {label: name for name, label in why.labels.items()}  # the summary names each group by its label
    parts = {code_of[label]: int(n) for n, label in (part.split(" ", 1) for part in m[3].split(", "))}
    assert parts == {k: n for k, n in why.counts().items() if k in why.no_gradient and n}
    bounded = silent & (why.codes != why.names.index("zero_advantage"))
    # a token mask acts before any bound: its tokens read as masked, whatever the region; a rollout correction
    # that dropped a token (weight 0) reads as the correction's, not as a bound of the objective
    for name in (*why.masks, *(n for n in grpo.explain.CORRECTION_WHYS if n in why.names)):
        bounded &= why.codes != why.names.index(name)
    unmasked = bd.tokens.policy_kept.bool()
    dropped = (bd.tokens.correction == MASKED) | (bd.tokens.correction == SEQUENCE_MASKED)
    flat = _counted(bd) & (bd.tokens.region > 1) & unmasked & ~dropped  # regions after "masked", "trust"
    assert torch.equal(bounded, flat)
    assert (m[4] is None) == (not bool(flat.any()))
    if m[4] is not None:
        _num(m[4], float(bd.tokens.ratio[flat].min()))
        _num(m[5] or m[4], float(bd.tokens.ratio[flat].max()))
    if m[6]:  # dual clip or delta held some: the clip metrics count the clipped ones only
        _num(re.search(rf"count only the clipped ones \({N}\)", m[6])[1], bd.metrics["clip_ratio/region_mean"])  # type: ignore[index]


def _correction(bd: Breakdown, m: re.Match[str]) -> None:
    """What the rollout correction did, counted from the breakdown's codes (numbers told as they are)."""
    code, counted = bd.tokens.correction, _counted(bd)
    said = {
        "dropped the policy term of": int((counted & (code == MASKED)).sum()),
        "the off-policy sequence mask dropped the policy term of": int((code == SEQUENCE_MASKED).sum()),
        "truncated the weight of": int((code == TRUNCATED).sum()),
        "rollout_rs rejected": int((code == REJECTED).sum()),
    }
    for words, n in said.items():
        found = re.search(rf"{words} (\d+) token", m[1])
        assert (int(found[1]) if found else 0) == n, (words, m[1])
    kept = counted & (code == KEPT)
    assert int(m[2]) == int(kept.sum())
    weights = bd.tokens.is_weight[kept]
    assert (m[3] is not None) == bool((weights != 1).any())  # the kept weights' range, where they are not 1
    if m[3] is not None:
        _num(m[3], float(weights.min()))
        _num(m[4], float(weights.max()))
    _num(m[5], float(bd.loss_without_correction))


def _trl_correction(bd: Breakdown, m: re.Match[str]) -> None:
    assert bd.config.preset == m[1] and bd.config.rollout_correction == "none"


def _unbounded(bd: Breakdown, m: re.Match[str]) -> None:
    why = token_why(bd)
    free = why.codes == why.names.index("unbounded")
    a = bd.advantages[:, None].expand_as(bd.tokens.ratio)
    assert bool((a[free] < 0).all()) and bd.config.dual_clip is None and bd.config.delta is None
    assert int(m[1]) == int(free.sum()) > 0
    _num(m[2], 1 + bd.config.epsilon_high)
    _num(m[3], float(bd.tokens.ratio[free].max()))
    assert bool((bd.tokens.ratio[free] > 1 + bd.config.epsilon_high).all())
    assert bool((bd.tokens.grad_policy[free] != 0).all())  # unbounded: the gradient is there, and grows


def _unbounded_other(bd: Breakdown, m: re.Match[str]) -> None:
    """Another objective's unbounded tokens (GMPO, Clip-Cov): A < 0, past its upper bound, a gradient kept."""
    why = token_why(bd)
    free = why.codes == why.names.index("unbounded")
    assert "delta" not in why.names and bool((bd.tokens.advantage[free] < 0).all())
    assert int(m[1]) == int(free.sum()) > 0
    _num(m[2], float(bd.tokens.ratio[free].max()))
    assert bool((bd.tokens.grad_policy[free] != 0).all())


def _gspo(bd: Breakdown, m: re.Match[str]) -> None:
    assert bd.config.importance_sampling_level == "sequence"
    _num(m[1], bd.metrics["lens/ratio/max"])
    _num(m[2], float(bd.tokens.log_ratio[_counted(bd)].exp().max()))


def _negative_kl(bd: Breakdown, m: re.Match[str]) -> None:
    kl = bd.tokens.kl[_counted(bd)]
    assert int(m[1]) == int((kl < 0).sum()) and int(m[2]) == kl.numel()
    _num(m[3], float(kl.min()))
    _num(m[4], bd.metrics["kl"])
    if m[5]:  # "its gradient is beta × the token's weight on every token alike"
        _num(m[5], bd.config.beta)
        c = _counted(bd)
        torch.testing.assert_close(bd.tokens.grad_kl[c], bd.config.beta * bd.tokens.weight[c], rtol=1e-5, atol=0)


def _clamp(bd: Breakdown, m: re.Match[str]) -> None:
    assert bd.clamp_counts[m[1]] == int(m[2]) > 0


def _zero_std(bd: Breakdown, m: re.Match[str]) -> None:
    assert int(m[1]) == len(bd.zero_std_groups) > 0
    _num(m[2], bd.metrics["frac_reward_zero_std"])
    share = re.search(rf"they hold {N} of the weight, so the other groups' policy gradient is {N}×", m[0])
    if share:  # the weight the zero-std rows' tokens still hold in the aggregation
        zero = torch.isin(bd.rows.group, torch.tensor(bd.zero_std_groups))[:, None] & _counted(bd)
        held = float(bd.tokens.weight[zero].sum() / bd.tokens.weight[_counted(bd)].sum())
        _num(share[1], held)
        _num(share[2], 1 - held)
    for g in bd.zero_std_groups:
        assert float(bd.advantages[bd.rows.group == g].abs().max()) == 0  # "their advantages are 0"


def _beta_zero(bd: Breakdown, m: re.Match[str]) -> None:
    assert bd.config.beta == 0 and float(bd.kl_loss) == 0


def _kl_dominates(bd: Breakdown, m: re.Match[str]) -> None:
    _, s, k, _ = _parts(bd)
    _num(m[1], k)
    assert k > 10 * abs(s)


def _selected(bd: Breakdown, m: re.Match[str]) -> None:
    """The tokens the objective's own rule picked, checked from the tensors: KL-Cov's carry exactly
    A·ratio − ppo_kl_coef·|log-ratio| (the others A·ratio); Clip-Cov's are cut to 0 with no gradient, at most
    max(1, int(clip_cov_ratio · N)) of them."""
    why = token_why(bd)
    assert why.selected is not None
    counted = _counted(bd)
    picked = why.codes == why.names.index(why.selected)
    n, k = int(counted.sum()), int(picked.sum())
    assert (int(m[1]), int(m[2])) == (k, n)
    if m[3] is not None:
        _num(m[3], float(bd.tokens.log_ratio[picked].abs().max()))
    assert m[4] == why.texts[why.selected]  # the rule's own sentence, with the config's numbers
    a = bd.advantages[:, None].expand_as(bd.tokens.ratio)
    plain = a * bd.tokens.ratio
    if why.selected in why.no_gradient:  # Clip-Cov: cut to 0, no gradient
        share = bd.config.clip_cov_ratio
        assert k <= max(1, int(share * n))
        assert bool((bd.tokens.surrogate[picked] == 0).all()) and bool((bd.tokens.grad_policy[picked] == 0).all())
        assert f"clip_cov_ratio = {grpo.explain.number(share)}" in m[4]
    else:  # KL-Cov: the penalty on exactly the picked tokens, and k of them
        share, coef = bd.config.kl_cov_ratio, bd.config.ppo_kl_coef
        assert bd.tokens.selected is not None and int(bd.tokens.selected.sum()) == max(1, int(share * n))
        # a picked token the entropy mask silenced reads entropy_masked: the mask acts on the whole term; one the
        # rollout correction dropped (weight 0) reads as the correction's
        dropped = (bd.tokens.correction == MASKED) | (bd.tokens.correction == SEQUENCE_MASKED)
        assert torch.equal(picked, bd.tokens.selected.bool() & bd.tokens.policy_kept.bool() & ~dropped)
        # the rollout correction's weight multiplies the whole policy term (1 without sampler log-probs)
        w = bd.tokens.is_weight
        penalised = (plain - coef * bd.tokens.log_ratio.abs()) * w
        torch.testing.assert_close(bd.tokens.surrogate[picked], penalised[picked], rtol=1e-12, atol=1e-15)
        rest = counted & ~bd.tokens.selected.bool() & bd.tokens.policy_kept.bool()
        torch.testing.assert_close(bd.tokens.surrogate[rest], (plain * w)[rest], rtol=1e-12, atol=1e-15)
        assert f"ppo_kl_coef = {grpo.explain.number(coef)}" in m[4] and "KL penalty applied" in m[4]


def _entropy_mask(bd: Breakdown, m: re.Match[str]) -> None:
    """The share, count and threshold of the high-entropy mask, from the entropies: the threshold is the
    (1 - quantile) quantile of the counted tokens' entropies (TRL: torch.quantile over them as float32)."""
    counted = _counted(bd)
    assert bd.entropies is not None
    q = bd.config.top_entropy_quantile
    threshold = float(torch.quantile(bd.entropies[counted].float(), 1 - q))
    kept = counted & (bd.entropies >= threshold)
    n, k = int(counted.sum()), int(kept.sum())
    _num(m[1], q)
    _num(m[2], 100 * k / n, 3)
    assert (int(m[3]), int(m[4])) == (n, k) and int(m[7]) == n - k
    _num(m[5], threshold)
    assert torch.equal(bd.tokens.policy_kept.bool() & counted, kept)
    silenced = bd.config.importance_sampling_level == "token"
    assert (m[6] == "the rest carry no policy gradient") == silenced
    if silenced:
        assert float(bd.tokens.grad_policy[counted & ~kept].abs().sum()) == 0


def _length(bd: Breakdown, m: re.Match[str]) -> None:
    length = _counted(bd).sum(dim=1)
    rows = [i for i in range(len(length)) if int(length[i])]
    short, long = int(m[1]), int(m[4])
    assert int(length[short]) == int(m[2]) == min(int(length[i]) for i in rows)
    assert int(length[long]) == int(m[5]) == max(int(length[i]) for i in rows)
    w_short = bd.tokens.weight[short][_counted(bd)[short]]
    w_long = bd.tokens.weight[long][_counted(bd)[long]]
    _num(m[3], float(w_short[0]))
    _num(m[6], float(w_long[0]))
    rest = m[7]
    if "counts the same" in rest:
        torch.testing.assert_close(w_short[0], w_long[0], rtol=1e-6, atol=0)
    elif "less" in rest:
        _num(re.search(r"(\S+)× less", rest)[1], float(w_short[0] / w_long[0]))  # type: ignore[index]
        assert float(w_short[0]) > float(w_long[0])
    else:
        assert float(w_long[0]) > float(w_short[0])


N = r"(-?\d+(?:\.\d+)?(?:e[-+]\d+)?)"
SENTENCES: list[tuple[str, Callable[[Breakdown, re.Match[str]], None]]] = [
    (
        rf"The loss is (?:about 0|negative|positive) \((?P<a>{N[1:-1]})\)"
        rf"(?:: its per-token terms, of total size (?P<b>{N[1:-1]}), cancel \(weighted surrogate "
        rf"(?P<c>{N[1:-1]}), beta·KL (?P<d>{N[1:-1]})\)\."
        rf"| because the weighted surrogate (?P<b2>{N[1:-1]}) exceeds beta·KL .*"
        r"|.*)",
        _sign,
    ),
    (
        r"The ratio is 1 everywhere \((?:on-policy|π = π_old: the trainer's own old policy; the sampler's log-probs "
        r"differ)\), so the policy part is minus the weighted (?:mean advantage|mean of each token's A times its "
        rf"rollout-correction weight \(0 where the correction dropped it\)), {N}, "
        rf"and nothing can clip(; the loss is small next to its terms, yet the gradient norm is {N}: a near-zero "
        r"loss does not mean a zero gradient)?\.",
        _on_policy,
    ),
    (
        rf"(\d+) of (\d+) tokens get no policy gradient: (.*?)(?: \(ratios? {N}(?: to {N})? on the bounded ones\))?\."
        r"(.*)",
        _flat,
    ),
    (
        r"The rollout correction acted: (.*)\. (\d+) token\(s\) kept their IS weight as it is"
        rf"(?: \({N} to {N}\))?; the loss without the correction would be {N} \(the Mismatch view shows each\)\.",
        _correction,
    ),
    (r"This preset \((trl-[a-z_]+)\) applies no rollout correction: TRL v1\.16 weighs .*", _trl_correction),
    (
        rf"(\d+) token\(s\) with A < 0 have a ratio above 1 \+ ε_high = {N} \(up to {N}\) and nothing bounds them: .*",
        _unbounded,
    ),
    (rf"(\d+) token\(s\) \(ratio up to {N}\) are unbounded: .*", _unbounded_other),
    (
        rf"Sequence-level ratio \(GSPO\): each token uses its row's ratio exp\(mean log-ratio\), at most {N} here "
        rf"\(lens/ratio/max\), while the token ratios themselves reach {N}\.",
        _gspo,
    ),
    (
        rf"The KL estimate is negative on (\d+) of (\d+) tokens \(as low as {N}; the batch's kl is {N}\): .*?"
        rf"(?: Its gradient is beta × the token's weight \(beta = {N}\) on every token alike.*)?",
        _negative_kl,
    ),
    (r"(\S+) acted on (\d+) token\(s\): a clamp passes no gradient where it acts.*", _clamp),
    (
        rf"(\d+) of (\d+) tokens picked by the objective's rule(?: \(\|log-ratio\| up to {N}\))?; a picked token is "
        r"(.*)\.",
        _selected,
    ),
    (
        rf"The entropy mask \(top_entropy_quantile = {N}\) kept {N}% of the (\d+) tokens: the (\d+) with entropy at "
        rf"least {N}; (.*) \((\d+) tokens\), while their KL term still counts\.",
        _entropy_mask,
    ),
    (rf"(\d+) group\(s\) have zero reward std \(frac_reward_zero_std = {N}\).*", _zero_std),
    (r"beta = 0: the KL term is off, so the loss is the policy term alone\.", _beta_zero),
    (rf"beta·KL \({N}\) dominates the loss.*", _kl_dominates),
    (
        rf"Per token, the shortest row \(row (\d+), (\d+) tokens?\) weighs {N} and the longest \(row (\d+), "
        rf"(\d+) tokens\) {N}(.*)",
        _length,
    ),
]


# The key explain_items gives each kind of sentence (the page finds a sentence by it, never by its words).
KEYS: dict[Callable[[Breakdown, re.Match[str]], None], str] = {
    _sign: "sign",
    _on_policy: "on_policy",
    _flat: "clip",
    _unbounded: "unbounded",
    _unbounded_other: "unbounded",
    _gspo: "gspo",
    _negative_kl: "negative_kl",
    _clamp: "clamp",
    _zero_std: "zero_std",
    _beta_zero: "kl_off",
    _kl_dominates: "kl_dominates",
    _length: "length",
    _selected: "selected",
    _entropy_mask: "entropy_mask",
    _correction: "correction",
    _trl_correction: "trl_correction",
}


def _check_sentences(bd: Breakdown) -> None:
    items = explain_items(bd)
    assert [text for _, text in items] == explain(bd)
    for key, sentence in items:
        matches = [(rx, check) for rx, check in SENTENCES if re.fullmatch(rx, sentence, flags=re.S)]
        assert len(matches) == 1, f"no single pattern for: {sentence}"
        rx, check = matches[0]
        assert KEYS[check] == key, (key, sentence)
        match = re.fullmatch(rx, sentence, flags=re.S)
        assert match is not None
        if check is _sign:
            _sign_match(bd, sentence)
        else:
            check(bd, match)


def _sign_match(bd: Breakdown, sentence: str) -> None:
    """The sign sentence has several forms: parse the one it is, then check it."""
    forms = [
        rf"The loss is about 0 \((?P<a>{N})\): its per-token terms, of total size (?P<b>{N}), cancel "
        rf"\(weighted surrogate (?P<c>{N}), beta·KL (?P<d>{N})\)\.",
        rf"The loss is negative \((?P<a>{N})\) because the weighted surrogate (?P<b>{N}) exceeds beta·KL "
        rf"(?P<c>{N}).*",
        rf"The loss is positive \((?P<a>{N})\): every policy term is 0 .*",
        rf"The loss is positive \((?P<a>{N})\): the policy terms cancel to about 0 \((?P<b>{N}), from terms of "
        rf"total size (?P<c>{N})\), so what is left is beta·KL (?P<d>{N})\.",
        rf"The loss is positive \((?P<a>{N})\) because beta·KL (?P<b>{N}) exceeds the weighted surrogate (?P<c>{N})\.",
        rf"The loss is positive \((?P<a>{N})\), mostly from beta·KL (?P<b>{N}); the weighted surrogate is negative "
        rf"too \((?P<c>{N})\).*",
        rf"The loss is positive \((?P<a>{N})\) because the weighted surrogate is itself negative \((?P<b>{N})\): "
        rf".*; beta·KL adds (?P<c>{N})\.",
    ]
    found = [m for rx in forms if (m := re.fullmatch(rx, sentence, flags=re.S))]
    assert len(found) == 1, sentence
    _sign(bd, found[0])


def _batch(per_token_logps: list[list[float]], **fields: object) -> grpo.Batch:
    return batch_from_request({"per_token_logps": per_token_logps, **fields})


# The page's findings' batches besides the scenarios (negative-loss and k1-negative are scenarios).
EXTRA_BATCHES: dict[str, tuple[grpo.Batch, dict[str, object]]] = {
    # A > 0 rows moved up past 1 + 0.2, A < 0 rows down past 1 - 0.2: every token on a flat part
    "all-clipped": (
        _batch(
            [[-0.2, -0.3], [-1.6, -1.9]],
            old_per_token_logps=[[-0.6, -0.7], [-1.2, -1.4]],
            rewards=[1.0, 0.0],
        ),
        {},
    ),
    # no reference: KL is 0 on every token, beta > 0
    "empty-KL": (
        _batch(
            [[-0.5, -1.0, -0.2], [-0.9, -0.4]],
            old_per_token_logps=[[-0.6, -0.9, -0.2], [-1.0, -0.5]],
            rewards=[1.0, 0.0],
        ),
        {},
    ),
    # logp - old = 14 on one token: ratio 1.2e6
    "huge-ratio": (
        _batch(
            [[-0.5, -1.0], [-0.3, -0.8]],
            old_per_token_logps=[[-14.5, -1.0], [-0.3, -0.9]],
            ref_per_token_logps=[[-0.4, -1.1], [-0.4, -0.7]],
            rewards=[0.0, 1.0],
        ),
        {},
    ),
    "zero-std": (_batch([[-0.5, -1.0], [-0.3]], ref_per_token_logps=[[-0.6, -0.9], [-0.5]], rewards=[1.0, 1.0]), {}),
}


def _all_batches() -> list[tuple[str, grpo.Batch, dict[str, object]]]:
    out: list[tuple[str, grpo.Batch, dict[str, object]]] = [
        (name, batch_from_request(s.request), {"preset": s.preset, **s.overrides}) for name, s in SCENARIOS.items()
    ]
    out += [(name, b, {"preset": "article", **o}) for name, (b, o) in EXTRA_BATCHES.items()]
    return out


CONFIG_VARIANTS: dict[str, dict[str, object]] = {
    "own": {},
    "trl-dr_grpo": {"preset": "trl-dr_grpo"},
    "verl-grpo": {"preset": "verl-grpo"},
    "k1": {"kl_estimator": "k1", "beta": 0.05},
    "k2-beta0": {"kl_estimator": "k2", "beta": 0.0},
    "dual-clip": {"dual_clip": 3.0},
    "delta": {"delta": 2.0},
    "trl-gspo": {"preset": "trl-gspo"},
    # the objectives' own picks: bounds and shares wide enough that some tokens are picked on small batches
    "verl-clip_cov": {"preset": "verl-clip_cov", "clip_cov_ratio": 0.3, "clip_cov_lb": -10.0, "clip_cov_ub": 10.0},
    "verl-kl_cov": {"preset": "verl-kl_cov", "kl_cov_ratio": 0.3, "ppo_kl_coef": 0.5},
    "verl-kl_cov-default": {"preset": "verl-kl_cov"},  # kl_cov_ratio 0.0002: max(1, int(...)) = 1 token
}


@pytest.mark.parametrize("variant", list(CONFIG_VARIANTS))
@pytest.mark.parametrize("case", _all_batches(), ids=lambda c: c[0])
def test_every_sentence_holds_numerically(case: tuple[str, grpo.Batch, dict[str, object]], variant: str) -> None:
    _, batch, own = case
    settings = {**own, **CONFIG_VARIANTS[variant]}
    preset = str(settings.pop("preset"))
    bd = grpo.evaluate(batch, grpo.LossConfig.from_preset(preset, dtype="float64", **settings))  # type: ignore[arg-type]
    _check_sentences(bd)


def test_the_listed_batches_show_what_they_are_for() -> None:
    """Each special batch produces the sentence it exists for (so the test above checks it)."""

    def sentences(name: str, **settings: object) -> str:
        batch, own = dict((n, (b, o)) for n, b, o in _all_batches())[name]
        cfg = {**own, **settings}
        bd = grpo.evaluate(batch, grpo.LossConfig.from_preset(str(cfg.pop("preset")), dtype="float64", **cfg))  # type: ignore[arg-type]
        return "\n".join(explain(bd))

    assert "The loss is negative" in sentences("negative-loss")
    assert "A > 0 have a ratio above 1" in sentences("negative-loss")
    k1 = sentences("k1-negative")
    assert "The KL estimate is negative on" in k1 and "on every token alike" in k1
    assert "4 of 4 tokens get no policy gradient: 2 clipped low, 2 clipped high" in sentences("all-clipped")
    # the ratio-1.2e6 token has A < 0: no clip bounds it (only a dual clip would), the surrogate goes hugely negative
    assert "the weighted surrogate is itself negative (-2.126e+05)" in sentences("huge-ratio")
    assert "zero reward std" in sentences("zero-std")
    assert "acted on" in sentences("huge-ratio", preset="verl-grpo", log_ratio_clamp=5.0)
    assert "near-zero loss does not mean a zero gradient" not in sentences("empty-KL")


def _with_entropies(batch: grpo.Batch, seed: int) -> grpo.Batch:
    """The batch with per-token entropies in [0, 3) (0 where nothing counts), some tied."""
    g = torch.Generator().manual_seed(seed)
    entropies = torch.rand(batch.logp.shape, generator=g, dtype=torch.float64) * 3
    entropies[:, ::3] = entropies[0, -1]
    return dataclasses.replace(batch, entropies=entropies * batch.mask)


@pytest.mark.parametrize("preset", ["trl-grpo", "trl-gspo", "verl-kl_cov"])
@pytest.mark.parametrize("quantile", [0.2, 0.5])
@pytest.mark.parametrize("case", _all_batches(), ids=lambda c: c[0])
def test_the_entropy_mask_sentence_holds_numerically(
    case: tuple[str, grpo.Batch, dict[str, object]], quantile: float, preset: str
) -> None:
    """The variants' marks: "the entropy mask kept 20% of tokens: the 34 with entropy above 2.31; the rest carry no
    policy gradient", every number from the tensors (and every other sentence still holds)."""
    name, batch, _ = case
    bd = grpo.evaluate(
        _with_entropies(batch, len(name)),
        grpo.LossConfig.from_preset(preset, dtype="float64", top_entropy_quantile=quantile),
    )
    _check_sentences(bd)
    assert any(key == "entropy_mask" for key, _ in explain_items(bd))


def test_kl_cov_and_clip_cov_name_their_tokens() -> None:
    """Before: KL-Cov's penalised tokens had no why (they read "trust"), and Clip-Cov's cut ones were region
    dual_clip on the page. Now each has its own code, label and sentence, with the config's numbers."""
    batch = batch_from_request(SCENARIOS["off-policy-clipping"].request)
    kl = grpo.evaluate(batch, grpo.LossConfig.from_preset("verl-kl_cov", dtype="float64", kl_cov_ratio=0.3))
    why = token_why(kl)
    assert why.selected == "kl_penalized" and why.counts()["kl_penalized"] == int(0.3 * 16) == 4
    assert why.labels["kl_penalized"] == "kl_cov: KL penalty applied"
    assert "kl_cov_ratio = 0.3" in why.texts["kl_penalized"] and "ppo_kl_coef = 0.1" in why.texts["kl_penalized"]
    assert "kl_penalized" not in why.no_gradient and "kl_penalized" in why.marked
    picked = kl.tokens.selected
    assert picked is not None and torch.equal(why.codes == why.names.index("kl_penalized"), picked.bool())
    cov = grpo.evaluate(
        batch,
        grpo.LossConfig.from_preset(
            "verl-clip_cov", dtype="float64", clip_cov_ratio=0.3, clip_cov_lb=-10.0, clip_cov_ub=10.0
        ),
    )
    why = token_why(cov)
    assert why.labels["cov_clipped"] == "selected by clip_cov (gradient detached)" and "dual_clip" not in why.names
    assert why.counts()["cov_clipped"] == 4 and "cov_clipped" in why.no_gradient
    text = "\n".join(explain(cov))
    assert "4 selected by clip_cov (gradient detached)" in text
    assert "4 of 16 tokens picked by the objective's rule" in text
