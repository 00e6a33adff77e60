"""The page's view-model: what the dashboard and ``python -m grpo eval --json`` show of a breakdown.

The answer's shape (``answer``), the sentences that explain each token and number (``explain``, ``glossary``),
the objective's curves (``curves``), the heatmaps' pooling (``pooling``), the per-token fields' table
(``token_fields``), the example batches (``examples``) and the experiments (``experiments``). The view reads
the math (grpo.loss, grpo.objectives, ...); the math never imports the view.
"""
