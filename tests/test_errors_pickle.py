"""Every exception class grpo/ and app/ define survives pickling, as it must to cross a process: a
``check-run --jobs N`` pool worker's error, a request's error in the server's worker processes. One that
cannot be unpickled kills a multiprocessing pool's result thread, and the parent then waits forever.

The classes are found by walking the packages' modules, so a new one is checked without being listed here.
"""

from __future__ import annotations

import importlib
import inspect
import multiprocessing
import pickle
import pkgutil
from collections.abc import Callable

import pytest

import app
import grpo
from app.errors import error_item

# an instance of each class whose __init__ does not take the message alone (as Exception's does)
EXAMPLES: dict[str, Callable[[], BaseException]] = {
    "grpo.errors.GrpoInputError": lambda: grpo.GrpoInputError("advantages", "finite values", row=2, got="nan"),
    "app.errors.ApiError": lambda: app.errors.ApiError(422, [error_item(["body", "x"], "bad", "value_error")]),
    "app.errors.LimitError": lambda: app.errors.LimitError(["body"], "the body is over 64 MB"),
    "app.lab_workers.LabRefused": lambda: app.lab_workers.LabRefused(429, "queue_full", "4 runs are waiting"),
}


def error_classes() -> list[type[BaseException]]:
    """Every exception class defined in a module of grpo/ or app/."""
    found: dict[str, type[BaseException]] = {}
    for package in (grpo, app):
        for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if module.name.endswith("__main__"):
                continue
            mod = importlib.import_module(module.name)
            for cls in vars(mod).values():
                if inspect.isclass(cls) and issubclass(cls, BaseException) and cls.__module__ == mod.__name__:
                    found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return [found[name] for name in sorted(found)]


CLASSES = error_classes()


def example(cls: type[BaseException]) -> BaseException:
    name = f"{cls.__module__}.{cls.__qualname__}"
    if name in EXAMPLES:
        return EXAMPLES[name]()
    try:
        return cls("a message")
    except TypeError:
        pytest.fail(f"{name}'s __init__ takes more than a message: add an instance to EXAMPLES")


def test_the_walk_finds_the_known_classes() -> None:
    names = {f"{c.__module__}.{c.__qualname__}" for c in CLASSES}
    assert set(EXAMPLES) <= names  # an example for a class that is gone (or a walk that misses modules)
    assert "app.lab_workers.OverBudget" in names


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: f"{c.__module__}.{c.__qualname__}")
def test_round_trip(cls: type[BaseException]) -> None:
    exc = example(cls)
    exc.add_note("a note added on the way")
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is cls
    assert str(back) == str(exc)
    assert back.args == exc.args
    assert vars(back) == vars(exc)  # every attribute (field, row, expected, got; status, items...) and the note


def bad_preset() -> None:
    grpo.LossConfig.from_preset("no-such-preset")


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_pool_worker_error_comes_back(method: str) -> None:
    """A GrpoInputError raised in a pool worker reaches the caller as itself, in bounded time (before the fix
    the result thread died unpickling it, and ``get`` waited forever: here, until the timeout)."""
    with pytest.raises(grpo.GrpoInputError) as raised:
        bad_preset()  # the error the worker raises, raised here to compare
    context = multiprocessing.get_context(method)
    with context.Pool(1) as pool:
        result = pool.apply_async(grpo.LossConfig.from_preset, ("no-such-preset",))
        with pytest.raises(grpo.GrpoInputError) as back:
            result.get(timeout=60)  # a spawned worker imports torch first: a second or two
    assert str(back.value) == str(raised.value)
    assert (back.value.field, back.value.expected) == (raised.value.field, raised.value.expected)
