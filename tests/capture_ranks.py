"""One process of a multi-process TRL run, captured (tests/test_capture_ranks.py launches two with torchrun).

python tests/capture_ranks.py OUTPUT_DIR RUN_DIR MODEL_DIR LOSS_TYPE [RANKS]

RANKS: the processes captured, comma-separated (``grpo.capture.trl``'s ``ranks``); default every one.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

from trainers import end_process_group, grpo_trainer

import grpo.capture

if __name__ == "__main__":
    out, run, model = (Path(a) for a in sys.argv[1:4])
    trainer = grpo_trainer(out, sys.argv[4], steps=2, model_dir=model)
    ranks = [int(r) for r in sys.argv[5].split(",")] if len(sys.argv) > 5 else None
    with grpo.capture.trl(trainer, run, ranks=ranks):
        trainer.train()
    end_process_group()
