"""The page's view-model: what the dashboard and ``python -m grpo eval --json`` show of a breakdown.

The answer's shape (``answer``), each token's why (``why``), the sentences that explain each token and number
(``explain`` and, by what they explain, ``explain_loss``, ``explain_tokens``, ``explain_rows``; ``glossary``),
the counted tokens they share (``counted``), the mismatch view (``mismatch``, its ``mismatch_gap``,
``mismatch_charts`` and ``mismatch_sentences``), the objective's curves (``curves``), the heatmaps' pooling
(``pooling``), the per-token fields' table (``token_fields``), the example batches (``examples``) and the
experiments (``experiments``). The view reads the math (grpo.loss, grpo.objectives, ...); the math never imports
the view (numbers in sentences are marked by ``grpo.marks``, which the math's warnings use too).
"""
