"""Weights across hosts: a version's served files travel by NATS's object store (bucket `swarm-weights`).

A trainer with `share_weights` puts each version (`WeightStore.put`, before the KV version names it)
as one object per file, `<model>/<version>/<file>`, then its manifest `<model>/<version>` (file ->
size and SHA-256), so a version with a manifest is whole; files already there with the same digest
are not sent again, and only the newest `KEEP_VERSIONS` are kept. An engine gets a version with
`local_weights`: the KV version's path when this host has it, else fetched into
`$SWARMRL_HOME/weights/<model>/v<version>/` (via a temporary sibling, renamed once whole), or
`WeightsUnavailable`: 404 when the bucket lacks it, 503 when NATS did not answer (worth retrying).
Optimizer and trainer state stay with the trainer (`SKIP`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import logging
import re
import shutil
import time
from pathlib import Path

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import ObjectMeta, ObjectMetaOptions
from nats.js.object_store import ObjectStore

from swarmrl.core.rundir import swarmrl_home
from swarmrl.schemas import ModelVersion
from swarmrl.schemas import subjects as S

log = logging.getLogger("swarmrl.objects")

KEEP_VERSIONS = 3
"""Versions kept in the bucket and in an engine's fetched directory: an engine a version or two behind
(still fetching, or cut off for a while) finds its version there."""
CHUNK_BYTES = 1024 * 1024
"""Object chunk size: a JetStream publish each, acknowledged one by one (the server takes 8 MB)."""
SKIP = re.compile(r"^(optimizer-rank\d+\.pt|trainer_state\.json)$")
"""A checkpoint's files no engine loads."""
FETCH_BYTES_PER_S = 2 * 1024 * 1024
"""Slowest fetch a healthy link is allowed (its timeout grows with the version's size)."""
FETCH_MIN_S = 30.0
MANIFEST = "manifest.json"
"""Written into a fetched version's directory last: the version is whole."""


class WeightsUnavailable(RuntimeError):
    """A version's files cannot be had on this host: `status` 404 (not in the bucket) or 503 (no answer)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def served_files(path: Path) -> list[Path]:
    """The files of checkpoint (or model) directory `path` an engine loads, relative to it."""
    return sorted(f.relative_to(path) for f in path.rglob("*") if f.is_file() and not SKIP.match(f.name))


def digest(path: Path) -> str:
    """The object store's digest of a file: `SHA-256=<base64url of the SHA-256>`."""
    with path.open("rb") as f:
        return "SHA-256=" + base64.urlsafe_b64encode(hashlib.file_digest(f, "sha256").digest()).decode()


def version_prefix(model: str, version: int) -> str:
    return f"{S.check_token(model, 'model name')}/{version}"


class WeightStore:
    """A trainer's side of the bucket: `await WeightStore.open(js, model)`, then `put` each version."""

    def __init__(self, obs: ObjectStore, model: str) -> None:
        self.obs, self.model = obs, model

    @classmethod
    async def open(cls, js: JetStreamContext, model: str) -> WeightStore:
        return cls(await js.object_store(S.WEIGHTS_BUCKET), model)

    async def put(self, version: int, path: Path) -> dict[str, int]:
        """Put version `version` (the served files of directory `path`), then purge the versions older
        than the newest `KEEP_VERSIONS`. Returns what it did: files sent, skipped, bytes sent."""
        started, prefix = time.monotonic(), version_prefix(self.model, version)
        files = await asyncio.to_thread(served_files, path)
        if not files:
            raise FileNotFoundError(f"{path}: no model files to share (is it a checkpoint directory?)")
        manifest, sent, skipped, nbytes = {}, 0, 0, 0
        for rel in files:
            local = path / rel
            sha = await asyncio.to_thread(digest, local)
            size = local.stat().st_size
            manifest[rel.as_posix()] = {"size": size, "digest": sha}
            name = f"{prefix}/{rel.as_posix()}"
            with contextlib.suppress(nats.js.errors.NotFoundError):
                if (await self.obs.get_info(name)).digest == sha:
                    skipped += 1
                    continue
            meta = ObjectMeta(name=name, options=ObjectMetaOptions(max_chunk_size=CHUNK_BYTES))
            with local.open("rb") as f:
                await self.obs.put(name, f, meta=meta)
            sent, nbytes = sent + 1, nbytes + size
        await self.obs.put(prefix, json.dumps({"version": version, "files": manifest}).encode())
        await self._purge(version)
        log.info("model=%s version=%d shared in %s: %d files sent (%d bytes), %d already there, %.1f s",
                 self.model, version, S.WEIGHTS_BUCKET, sent, nbytes, skipped, time.monotonic() - started)  # fmt: skip
        return {"sent": sent, "skipped": skipped, "bytes": nbytes}

    async def _purge(self, newest: int) -> None:
        try:
            infos = await self.obs.list(ignore_deletes=True)
        except nats.js.errors.NotFoundError:
            return
        mine = re.compile(rf"^{re.escape(self.model)}/(\d+)(/|$)")
        versions: dict[int, list[str]] = {}
        for info in infos:
            if info.name and (m := mine.match(info.name)):
                versions.setdefault(int(m.group(1)), []).append(info.name)
        for version in sorted(v for v in versions if v <= newest)[:-KEEP_VERSIONS]:  # newer ones stay too
            # the manifest (the shortest name) last: the version is whole until it goes
            for name in sorted(versions[version], key=len, reverse=True):
                with contextlib.suppress(nats.js.errors.NotFoundError):
                    await self.obs.delete(name)


def fetched_root(model: str) -> Path:
    """Where an engine on this host keeps the versions it fetched: `$SWARMRL_HOME/weights/<model>`."""
    return swarmrl_home() / "weights" / S.check_token(model, "model name")


async def local_weights(
    js: JetStreamContext, model: str, mv: ModelVersion, timeout_s: float | None = None
) -> str:
    """The directory of version `mv` on this host: `mv.path` if it is here, else fetched (module docstring)."""
    dest = fetched_root(model) / f"v{mv.version}"
    if here := await asyncio.to_thread(_on_this_host, mv.path, dest):
        return here
    prefix = version_prefix(model, mv.version)
    try:
        obs = await js.object_store(S.WEIGHTS_BUCKET)
        manifest = json.loads((await obs.get(prefix)).data or b"{}")
        size = sum(f["size"] for f in manifest["files"].values())
        limit = timeout_s or FETCH_MIN_S + size / FETCH_BYTES_PER_S
        await asyncio.wait_for(_fetch(obs, prefix, manifest, dest), limit)
    except nats.js.errors.NotFoundError as exc:
        raise WeightsUnavailable(
            404, f"{mv.path} is not on this host and {S.WEIGHTS_BUCKET} has no {prefix} (does the trainer "
            f"of {model} share its weights, `[models.{model}.trainer] share_weights = true`?)",
        ) from exc  # fmt: skip
    except (nats.errors.Error, TimeoutError, OSError) as exc:
        raise WeightsUnavailable(503, f"fetching {prefix} from {S.WEIGHTS_BUCKET} failed: {exc!r}") from exc
    await asyncio.to_thread(_prune, dest.parent, mv.version)
    log.info("model=%s version=%d fetched from %s into %s", model, mv.version, S.WEIGHTS_BUCKET, dest)
    return str(dest)


def _on_this_host(path: str, dest: Path) -> str:
    """`path` if this host has it, else `dest` if fetched before, else ""."""
    if Path(path).is_dir():
        return path
    return str(dest) if (dest / MANIFEST).is_file() else ""


async def _fetch(obs: ObjectStore, prefix: str, manifest: dict[str, object], dest: Path) -> None:
    tmp = dest.with_name(f"{dest.name}.tmp-{time.monotonic_ns()}")
    files = manifest["files"]
    assert isinstance(files, dict)
    try:
        for rel in files:
            target = tmp / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            with target.open("wb") as f:  # nats-py checks each object's digest as it arrives
                await obs.get(f"{prefix}/{rel}", writeinto=f)
        (tmp / MANIFEST).write_text(json.dumps(manifest))
        try:
            tmp.rename(dest)
        except OSError:  # another engine of this host fetched it first: its copy is the same
            if not (dest / MANIFEST).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _prune(root: Path, newest: int) -> None:
    """Keep the newest `KEEP_VERSIONS` fetched versions up to `newest` (and any newer ones)."""
    found = sorted(int(p.name[1:]) for p in root.glob("v*") if p.name[1:].isdigit())
    older = [v for v in found if v <= newest][:-KEEP_VERSIONS]
    for v in older:
        shutil.rmtree(root / f"v{v}", ignore_errors=True)
