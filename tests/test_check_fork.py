"""check-run's local pool forks its workers only where a fork is safe.

A full ``pytest`` run hung here: test_capture_ray ran Ray in the test process (``ray.init``, then
``ray.shutdown``, whose gRPC threads live on), and a later in-process ``check-run`` forked its pool; a forked
child waited forever on a lock one of those native threads held at the fork. ``check_pool`` now spawns its
workers in a process that holds other threads or has imported a library known to start them.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

import grpo
from grpo.check import check_pool, fork_is_safe
from grpo.runs import RunWriter

ROOT = Path(__file__).resolve().parent.parent


def small_run(run_dir: Path) -> Path:
    """Four micro-batches of 4 x 16, each with the loss its config gives as the trainer's."""
    config = grpo.LossConfig.from_preset("trl-dapo")
    writer = RunWriter(run_dir, "trl", config)
    g = torch.Generator().manual_seed(0)
    for i in range(4):
        old = -torch.rand(4, 16, generator=g) * 2 - 0.01
        tensors = {
            "per_token_logps": (old + 0.05 * torch.randn(4, 16, generator=g)).clamp(max=0),
            "old_per_token_logps": old,
            "completion_mask": torch.ones(4, 16),
            "advantages": torch.randn(4, generator=g),
        }
        batch = grpo.Batch(**tensors)
        writer.write_step(i + 1, 0, tensors, {"loss": float(grpo.evaluate(batch, config).loss)})
    writer.update(status="done")
    return run_dir


def test_a_thread_or_a_threaded_library_rules_the_fork_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "ray", raising=False)
    monkeypatch.delitem(sys.modules, "grpc", raising=False)
    with monkeypatch.context() as alone:  # a process with its main thread only (a test run has had others)
        alone.setattr(threading, "active_count", lambda: 1)
        assert fork_is_safe()
        alone.setitem(sys.modules, "grpc", sys)  # any module object: its name is what counts
        assert not fork_is_safe()
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, daemon=True)
    thread.start()
    try:
        assert not fork_is_safe()
        with check_pool(2) as pool:  # spawned: the pool's processes still work
            assert pool is not None
            assert list(pool.imap(abs, [-1, 2, -3])) == [1, 2, 3]
    finally:
        stop.set()
        thread.join()


def test_check_run_after_ray_in_the_same_process_finishes(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    run_dir = small_run(tmp_path / "run")
    script = (
        "import ray, sys\n"
        "ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)\n"
        "ray.shutdown()\n"
        "from grpo.__main__ import main\n"
        "sys.exit(main(['check-run', sys.argv[1], '--jobs', '2']))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(run_dir)], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "steps: match" in done.stdout
