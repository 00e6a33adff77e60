"""A run's check as the table ``python -m grpo check-run`` prints."""

from __future__ import annotations

from grpo.check_results import RunCheck


def format_check(check: RunCheck) -> str:
    """The check as a table: one line per micro-batch, then one per step, then the verdict and what was not
    compared, with why."""
    lines = [f"run {check.run}: rtol {check.rtol:g}, metrics to {check.metric_atol:g}"]
    lines.append(
        f"{'step':>6} {'micro':>5} {'trainer loss':>14} {'lens loss':>14} {'rel error':>10} {'max metric diff':>16}  "
    )
    for m in check.micro:
        worst = max(m.metrics.items(), key=lambda kv: kv[1].diff, default=None)
        worst_text = f"{worst[1].diff:.2e} {worst[0]}" if worst else "-"
        rank = "" if m.rank is None else f" r{m.rank}"
        lines.append(
            f"{m.step:>6} {m.micro:>5}{rank} {_num(m.trainer_loss):>14} {_num(m.lens_loss):>14} "
            f"{_sci(m.rel_error):>10} {worst_text:>16}  {m.verdict}"
        )
        if m.error is not None:
            lines.append(f"{'':>13}error: {m.error}")
    lines.append("")
    lines.append(
        f"{'step':>6} {'micros':>6} {'trainer loss':>14} {'lens loss':>14} {'logged loss':>14} "
        f"{'logged metrics':>15} {'max diff':>9}"
    )
    for s in check.steps:
        largest = max((v.diff for v in s.metrics.values()), default=None)
        logged = _num(s.logged_loss.trainer) if s.logged_loss else "-"
        lines.append(
            f"{s.step:>6} {s.micro_batches:>6} {_num(s.trainer_loss):>14} {_num(s.lens_loss):>14} {logged:>14} "
            f"{len(s.metrics):>15} {_sci(largest):>9}  {s.verdict}"
        )
    counts = check.counts()
    said = ", ".join(f"{n} {v}" for v, n in counts.items() if n)
    lines.append(f"{len(check.micro)} micro-batches ({said or 'none'}), {len(check.steps)} steps: {check.verdict}")
    reasons = check.unchecked_reasons()
    if reasons:
        lines.append("not compared:")
        lines.extend(f"  - {reason} ({n})" for reason, n in reasons)
    return "\n".join(lines)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.8g}"


def _sci(value: float | None) -> str:
    return "-" if value is None else f"{value:.2e}"
