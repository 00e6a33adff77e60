"""Importers: other trainers' dumps as GRPO Lens runs (``python -m grpo import <trainer> DIR RUN_DIR``).

``nemo-rl``: NeMo RL's ``train_data_step{N}.jsonl``; ``slime``: slime's debug train data (``*.pt``, read with
``weights_only=True``). Each writes a new run directory whole, or nothing when the dump is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from grpo.importers.nemo_rl import import_nemo_rl, map_nemo_rl, read_config
from grpo.importers.slime import import_slime, map_slime

IMPORTERS: dict[str, Callable[[str | Path, str | Path, Any], Path]] = {
    "nemo-rl": import_nemo_rl,
    "slime": import_slime,
}
CONFIG_READERS: dict[str, Callable[[Path], Any]] = {"nemo-rl": read_config}
"""How ``--config FILE`` is read for a trainer whose config files compose (NeMo RL's ``defaults:``, relative to
the file); the others' are plain JSON or YAML."""

__all__ = ["CONFIG_READERS", "IMPORTERS", "import_nemo_rl", "import_slime", "map_nemo_rl", "map_slime", "read_config"]
