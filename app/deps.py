"""What routes are given, one way (FastAPI ``Depends``): the settings, the run store, the lanes, the
sign-in sessions, the lab manager and the lab's stream caps, the running runs' watcher, each made once with the app
(``app.main.create_app``) and kept on its state. A route names what it needs in its signature
(``settings: SettingsDep``) and never reads ``request.app.state`` itself.

The stream caps are made on first use, and so is the lab manager when the app runs without its lifespan (a
test client used without ``with``): the lab router's lifespan makes it otherwise (``started_lab``).

Every dependency is ``async def``: FastAPI runs a plain ``def`` dependency in its thread pool, a thread hop
(and a wait for the GIL) per dependency per request for what is an attribute read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Annotated, TypeVar

from fastapi import Depends, Request
from starlette.datastructures import State

from app.auth import Sessions
from app.lab_streams import StreamCaps, client_key
from app.lab_workers import LabManager, new_manager
from app.lanes import Lanes
from app.run_streams import RunStreams
from app.settings import Settings
from app.store import RunStore
from app.watch import Watcher

T = TypeVar("T")


async def settings(request: Request) -> Settings:
    found: Settings = request.app.state.settings
    return found


async def store(request: Request) -> RunStore:
    found: RunStore = request.app.state.store
    return found


async def lanes(request: Request) -> Lanes:
    found: Lanes = request.app.state.lanes
    return found


def _made_once(request: Request, name: str, make: Callable[[State], T]) -> T:
    """The app state's ``name``, made by ``make`` from the state on first use (when nothing made it before)."""
    state: State = request.app.state
    if getattr(state, name, None) is None:
        setattr(state, name, make(state))
    found: T = getattr(state, name)
    return found


def started_lab(state: State) -> LabManager:
    """A new lab manager for the app's settings and run store, started on the running loop."""
    manager = new_manager(state.settings, state.store.remaining_bytes)
    manager.start(asyncio.get_running_loop())
    return manager


def _stream_caps(state: State) -> StreamCaps:
    return StreamCaps(state.settings.lab_max_streams_per_run, state.settings.lab_max_streams_per_client)


async def lab(request: Request) -> LabManager:
    return _made_once(request, "lab", started_lab)


async def stream_caps(request: Request) -> StreamCaps:
    return _made_once(request, "lab_streams", _stream_caps)


async def watcher(request: Request) -> Watcher:
    found: Watcher = request.app.state.watcher
    return found


async def run_streams(request: Request) -> RunStreams:
    """What a running run's event stream counts under: the lab's caps and stall limit (one budget per client)."""
    settings_: Settings = request.app.state.settings
    return RunStreams(
        await stream_caps(request), await lab(request), settings_.lab_stream_stall_seconds, settings_.lab_stream_history
    )


def _sessions(request: Request) -> Sessions | None:
    found: Sessions | None = request.app.state.sessions
    return found


async def sessions(request: Request) -> Sessions | None:
    """The sign-in sessions (None: the instance has no token, so no sign-in)."""
    return _sessions(request)


async def stream_client(request: Request) -> str:
    """Who opens an event stream, for the per-client cap (``app.lab_streams.client_key``)."""
    address = request.client.host if request.client else ""
    return client_key(_sessions(request), request.headers.get("cookie", ""), address)


SettingsDep = Annotated[Settings, Depends(settings)]
StoreDep = Annotated[RunStore, Depends(store)]
LanesDep = Annotated[Lanes, Depends(lanes)]
SessionsDep = Annotated[Sessions | None, Depends(sessions)]
LabDep = Annotated[LabManager, Depends(lab)]
StreamCapsDep = Annotated[StreamCaps, Depends(stream_caps)]
StreamClientDep = Annotated[str, Depends(stream_client)]
WatcherDep = Annotated[Watcher, Depends(watcher)]
RunStreamsDep = Annotated[RunStreams, Depends(run_streams)]
