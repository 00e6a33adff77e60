"""``import grpo`` changes nothing in the process: no allocator tuning, thread count or seed.

Checked in a fresh process (this one has imported grpo long ago), with torch and NumPy imported
first so that only grpo's own effects are compared.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import json, os, random
import numpy as np
import torch

def state():
    return {
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "torch_rng": torch.get_rng_state().tolist(),
        "torch_seed": torch.initial_seed(),
        "python_rng": repr(random.getstate()),
        "numpy_rng": repr(np.random.get_state()),
        "environ": sorted(os.environ.items()),
    }

before = state()
import grpo
import grpo._allocator
after = state()
print(json.dumps({
    "unchanged": [k for k in before if before[k] == after[k]],
    "changed": [k for k in before if before[k] != after[k]],
    "allocator_applied": grpo._allocator.applied,
}))
"""


def test_import_grpo_has_no_process_wide_side_effects() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["changed"] == []
    assert len(report["unchanged"]) == 7
    assert report["allocator_applied"] is False  # glibc's mallopt was not called


def test_keep_freed_memory_is_opt_in_and_records_that_it_ran() -> None:
    probe = "import grpo._allocator as a; print(a.applied, a.keep_freed_memory() == a.applied, a.applied)"
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    before, consistent, after = done.stdout.split()
    assert before == "False" and consistent == "True"
    tunable = sys.platform.startswith("linux") and not os.environ.get("GRPO_LENS_KEEP_MALLOC")
    assert after == str(tunable)  # glibc took the thresholds (musl would not: not tested here)
