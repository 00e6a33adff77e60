"""/api/v1/runs: captured and lab runs under GRPO_LENS_RUNS_DIR, listed, checked, stepped through, replayed.

Thin routes over grpo.runs and grpo.check. Run names are single path segments of letters, digits,
``-``, ``_`` and ``.``; an uploaded zip is unpacked member by member with every path checked to
stay inside the run (no absolute paths, no ``..``, no links), its sizes read from the zip's
directory before anything is written, its run.json and every step file read as the views will
read them, and the run moved into place with one rename.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import tempfile
import zipfile
from pathlib import Path, PurePosixPath
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Depends, File, Form, HTTPException, Query, Request, UploadFile
from fastapi.responses import Response

import grpo
from app.api import JSONBytes
from app.errors import LimitError
from app.schemas import ErrorResponse
from app.settings import Settings
from app.work import json_form
from grpo.answer import breakdown_to_json
from grpo.check import check_run, replay, run_overview, step_batch
from grpo.errors import GrpoInputError
from grpo.requests import batch_from_request, row_lengths
from grpo.runs import STEP_FILE, Run, list_runs, load_run, load_step

router = APIRouter(prefix="/api/v1/runs", tags=["runs"])
RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"model": ErrorResponse, "description": "No such run or step"}}
TOO_LARGE: dict[int | str, dict[str, Any]] = {
    413: {"model": ErrorResponse, "description": "Past a size limit (a setting): the zipped run or its contents"}
}


def _settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


SettingsDep = Annotated[Settings, Depends(_settings)]


async def run_sync(request: Request, fn: Any, *args: Any) -> Any:
    """CPU work off the event loop, in the small-request lane's threads."""
    return await anyio.to_thread.run_sync(lambda: fn(*args), limiter=request.app.state.lanes.threads)


def _breakdown(fields: dict[str, Any], config: grpo.LossConfig, settings: Settings) -> dict[str, Any]:
    """A step's batch under ``config``, answered as /api/v1/loss answers."""
    bd = grpo.evaluate(batch_from_request(fields), config)
    return breakdown_to_json(bd, row_lengths(fields), None, max_tokens=settings.full_token_limit)


def _not_found(loc: list[str | int], msg: str) -> HTTPException:
    return HTTPException(404, [{"loc": loc, "msg": msg, "type": "not_found"}])


def _run_dir(settings: Settings, name: str) -> Path:
    if not RUN_NAME.match(name):
        raise _not_found(["path", "run"], f"no run {name!r}: names are letters, digits, '.', '-' and '_'")
    path = Path(settings.runs_dir) / name
    if not (path / "run.json").is_file():
        raise _not_found(["path", "run"], f"no run {name!r} under the runs directory")
    return path


def _load(settings: Settings, name: str) -> Run:
    return load_run(_run_dir(settings, name))


def _config_param(config: str | None) -> dict[str, Any] | None:
    value = json_form("config", config)
    if value is not None and not isinstance(value, dict):
        raise GrpoInputError("config", "a JSON object: a preset and LossConfig fields", got=type(value).__name__)
    return value


@router.get("", summary="The runs under GRPO_LENS_RUNS_DIR, newest first")
def runs(settings: SettingsDep) -> list[dict[str, Any]]:
    return [run.summary() for run in list_runs(settings.runs_dir)]


@router.get("/{run}", responses=NOT_FOUND, response_class=JSONBytes, summary="A run: steps, trainer vs recomputed")
async def run_detail(run: str, request: Request, settings: SettingsDep) -> JSONBytes:
    loaded = _load(settings, run)
    return JSONBytes(await run_sync(request, lambda: run_overview(loaded, check_run(loaded))))


@router.get(
    "/{run}/steps/{step}",
    responses=NOT_FOUND,
    response_class=JSONBytes,
    summary="A step's breakdown (the whole step, or one micro-batch with ?micro=; config overrides as ?config=)",
)
async def step_detail(
    run: str,
    step: int,
    request: Request,
    settings: SettingsDep,
    micro: Annotated[int | None, Query(ge=0, le=999)] = None,
    config: Annotated[str | None, Query(description="A JSON object of LossConfig fields (preset included)")] = None,
) -> JSONBytes:
    loaded = _load(settings, run)
    if step not in loaded.step_numbers() or (
        micro is not None and micro not in [r.micro for r in loaded.micro_batches(step)]
    ):
        where = f"step {step}" + ("" if micro is None else f" micro-batch {micro}")
        raise _not_found(["path", "step"], f"run {run!r} has no {where}")
    overrides = _config_param(config)

    def compute() -> dict[str, Any]:
        from grpo.check import replay_config

        fields, stored, info = step_batch(loaded, step, micro)
        resolved = replay_config(stored, overrides)
        breakdown = _breakdown(fields, resolved, settings)
        request_body = {**fields, "config": {k: v for k, v in resolved.to_dict().items() if k not in ("device",)}}
        return {"run": run, **info, "breakdown": breakdown, "request": request_body}

    return JSONBytes(await run_sync(request, compute))


@router.delete("/{run}", responses=NOT_FOUND, status_code=204, summary="Delete a run")
def delete_run(run: str, settings: SettingsDep) -> Response:
    path = _run_dir(settings, run)
    trash = path.with_name(f".deleting-{path.name}")
    path.rename(trash)  # one rename: the run disappears whole, then its files go
    shutil.rmtree(trash)
    return Response(status_code=204)


@router.get("/{run}/download", responses=NOT_FOUND, summary="The run as a zip (run.json and steps/)")
def download(run: str, settings: SettingsDep) -> Response:
    path = _run_dir(settings, run)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.write(path / "run.json", "run.json")
        for file in sorted((path / "steps").glob("*.safetensors")):
            archive.write(file, f"steps/{file.name}")
    headers = {"content-disposition": f'attachment; filename="{run}.zip"'}
    return Response(buffer.getvalue(), media_type="application/zip", headers=headers)


@router.post(
    "/{run}/replay",
    responses=NOT_FOUND,
    response_class=JSONBytes,
    summary="The same captured batches under another config, step by step, beside the original",
)
async def replay_run(run: str, request: Request, settings: SettingsDep, body: dict[str, Any]) -> JSONBytes:
    loaded = _load(settings, run)
    overrides = body.get("config", body)
    if not isinstance(overrides, dict):
        raise GrpoInputError("config", "a JSON object: a preset and LossConfig fields", got=type(overrides).__name__)
    return JSONBytes(await run_sync(request, replay, loaded, overrides))


@router.post("", responses=TOO_LARGE, status_code=201, summary="Upload a zipped run (run.json and steps/*.safetensors)")
async def upload_run(
    request: Request,
    settings: SettingsDep,
    file: Annotated[UploadFile, File(description="A zip of run.json and steps/*.safetensors")],
    name: Annotated[str | None, Form(description="The run's name (default: the file's name)")] = None,
) -> dict[str, Any]:
    data = await file.read(settings.max_upload_bytes + 1)
    if len(data) > settings.max_upload_bytes:
        raise LimitError(["body", "file"], f"file larger than {settings.max_upload_bytes} bytes (a setting)")
    run_name = name or Path(file.filename or "upload").stem
    if not RUN_NAME.match(run_name):
        raise GrpoInputError("name", "a run name of letters, digits, '.', '-' and '_'", got=repr(run_name)[:80])
    target = Path(settings.runs_dir) / run_name
    if target.exists():
        raise HTTPException(409, [{"loc": ["body", "name"], "msg": f"a run {run_name!r} exists", "type": "conflict"}])
    await run_sync(request, unpack_run, data, target, settings.max_unpacked_bytes)
    return load_run(target).summary()


def unpack_run(data: bytes, target: Path, max_bytes: int) -> None:
    """Unpack a zipped run into ``target``: only run.json and steps/NNNNNN-NNN[-rankR].safetensors."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile as exc:
        raise GrpoInputError("file", "a zip of a run (run.json and steps/)") from exc
    with archive:
        members = archive.infolist()
        total = sum(m.file_size for m in members)
        if total > max_bytes:
            raise LimitError(["body", "file"], f"unpacks to {total} bytes; at most {max_bytes} (a setting)")
        for member in members:
            _check_member(member)
        if "run.json" not in {m.filename for m in members}:
            raise GrpoInputError("file", "a zip holding run.json at its top")
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".upload-{target.name}-"))
        try:
            for member in members:
                if member.is_dir():
                    continue
                out = staging / member.filename
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(archive.read(member))
            run = load_run(staging)  # JSON and format checked before the run appears,
            for ref in run.steps:  # and every step file read as the run's views will read it
                load_step(ref.path)
            info = run.info
            info["uploaded"] = True
            (staging / "run.json").write_text(json.dumps(info, indent=1))
            staging.rename(target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise


def _check_member(member: zipfile.ZipInfo) -> None:
    name = member.filename
    path = PurePosixPath(name)
    is_link = (member.external_attr >> 16) & 0o170000 == 0o120000
    inside = not path.is_absolute() and ".." not in path.parts and "\\" not in name and not is_link
    allowed = name in ("run.json", "steps/") or (
        len(path.parts) == 2 and path.parts[0] == "steps" and STEP_FILE.match(path.name) is not None
    )
    if not inside or not allowed:
        raise GrpoInputError(
            "file", "members run.json and steps/NNNNNN-NNN.safetensors only, inside the run", got=repr(name)[:120]
        )
