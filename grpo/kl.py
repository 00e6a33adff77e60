"""KL estimators: per-token estimates of KL(pi || pi_ref) from sampled-token log-probs only.

Every estimator takes ``x = ref_logp - logp`` (B, T), the log of pi_ref / pi at the sampled
token, and returns the estimate (B, T). Schulman's k1, k2, k3 (http://joschu.net/blog/kl-approx.html)
and verl's ``abs``. The clamps (verl's ±20 on x and ±10 on the estimate), verl's straight-through
"+" types (the estimate's value with k2's gradient) and TRL's bias correction are applied around
the estimator by ``grpo.loss.kl_penalty``, so each appears once, as a named config field.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from grpo.registry import KLEstimatorRegistry

KLEstimator = Callable[[Tensor], Tensor]
KL_ESTIMATORS: KLEstimatorRegistry[KLEstimator] = KLEstimatorRegistry("kl_estimator")


@KL_ESTIMATORS.register("k1", label="k1: log ratio")
def k1(x: Tensor) -> Tensor:
    """k1 = log(pi / pi_ref): unbiased but high variance, and negative for half the tokens.

    verl ``kl``/``k1``. Its gradient is 1 per token whatever pi_ref is, so as a loss term it only
    pushes every sampled log-prob down.
    Paper: http://joschu.net/blog/kl-approx.html
    """
    return -x


@KL_ESTIMATORS.register("k2", label="k2: squared log ratio / 2")
def k2(x: Tensor) -> Tensor:
    """k2 = ½·(log pi - log pi_ref)²: low variance, biased, always >= 0.

    verl ``mse``/``k2``. Its gradient (logp - ref) is the gradient of the reverse KL on-policy.
    Paper: http://joschu.net/blog/kl-approx.html
    """
    return 0.5 * x.square()


@KL_ESTIMATORS.register("k3", label="k3: low variance (GRPO)")
def k3(x: Tensor) -> Tensor:
    """k3 = pi_ref/pi - log(pi_ref/pi) - 1: unbiased, low variance, always >= 0 (GRPO's choice).

    Computed as exp(x) - x - 1 with x = ref - logp (as expm1(x) - x, accurate near 0), never as a
    ratio of two exps, which under- and overflows. verl ``low_var_kl``; DeepSeekMath eq. 4.
    Paper: https://arxiv.org/abs/2402.03300
    """
    return torch.expm1(x) - x


@KL_ESTIMATORS.register("abs", label="abs: |log ratio|")
def abs_log_ratio(x: Tensor) -> Tensor:
    """abs = |log pi - log pi_ref|: always >= 0, biased, with a gradient of ±1 per token (its sign
    is the sign of logp - ref: it pulls every log-prob toward the reference at one rate).

    verl ``abs`` (``abs+``: this value with k2's gradient, see ``LossConfig.kl_gradient``).
    Paper: http://joschu.net/blog/kl-approx.html
    """
    return x.abs()
