"""SQL over NATS: a ledger answers queries from its own Parquet files, so no other host needs them.

Every ledger process serves `swarmrl-ledger` (`nats.micro`) on `S.LEDGER_QUERY`, a control subject,
in the replicas' queue group; `swarmrl query --remote` is the client (`ask`).

    request  {"sql": "SELECT status, count(*) FROM episodes GROUP BY status"}
    reply    {"ok": true, "columns": ["status", "count_star()"], "rows": [["ok", 12]], "run_dir": "..."}
             {"ok": false, "error": "..."}

A query runs on its own DuckDB connection locked to the run's ledger directory, as one reading
statement, interrupted after `QUERY_TIMEOUT_S`. Replicas on different hosts each hold only their
partitions' files, so keep a swarm's ledgers on one host to query them whole.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import threading
from pathlib import Path
from typing import Any

import duckdb

from swarmrl.schemas import subjects as S
from swarmrl.services.ledger.store import ledger_dir
from swarmrl.services.ledger.views import quote, register_views

log = logging.getLogger("swarmrl.ledger")

SERVICE_NAME = "swarmrl-ledger"
QUERY_TIMEOUT_S = 60.0
MAX_REPLY_BYTES = 4 * 1024 * 1024
"""Half the largest NATS message the bundled servers take (8 MB)."""
READING = {duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN}


def jsonable(value: Any) -> Any:
    """JSON `default=`: bytes as base64, anything else as its text."""
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    return str(value)


def run_query(run_dir: Path, sql: str, timeout_s: float = QUERY_TIMEOUT_S) -> dict[str, Any]:
    """The reply to `sql` over `run_dir`'s ledger (pure DuckDB, no NATS)."""
    con = duckdb.connect()
    try:
        register_views(con, run_dir)
        roots = {str(ledger_dir(run_dir)), str(ledger_dir(run_dir).resolve())}  # as the views name it
        con.execute(f"SET allowed_directories = [{', '.join(map(quote, sorted(roots)))}]")
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
        kinds = [s.type for s in con.extract_statements(sql)]
        if len(kinds) != 1 or kinds[0] not in READING:
            names = [k.name for k in kinds]
            error = f"one reading statement (SELECT, DESCRIBE, SHOW, EXPLAIN) per query, not {names}"
            return {"ok": False, "error": error}
        timer = threading.Timer(timeout_s, con.interrupt)
        timer.start()
        try:
            return execute(con, sql) | {"run_dir": str(run_dir)}
        finally:
            timer.cancel()
    except duckdb.Error as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    finally:
        con.close()


def execute(con: duckdb.DuckDBPyConnection, sql: str) -> dict[str, Any]:
    """The reply to `sql` on `con`, a DuckDB error included."""
    try:
        result = con.execute(sql)
        columns = [d[0] for d in result.description] if result.description else []
        rows = [list(r) for r in result.fetchall()] if columns else []
    except duckdb.Error as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    return {"ok": True, "columns": columns, "rows": rows}


def encode_reply(reply: dict[str, Any]) -> bytes:
    data = json.dumps(reply, default=jsonable).encode()
    if len(data) > MAX_REPLY_BYTES:
        rows = len(reply.get("rows", []))
        return json.dumps({"ok": False, "error": f"result of {rows} rows is {len(data)} bytes, more than "
                           f"{MAX_REPLY_BYTES}: add a LIMIT or select fewer columns"}).encode()  # fmt: skip
    return data


async def serve_queries(nc: Any, run_dir: Path) -> Any:
    """Start the `nats.micro` service of one ledger process; `await service.stop()` ends it."""
    from nats import micro

    service = await micro.add_service(
        nc, name=SERVICE_NAME, version="1.0.0", description="SQL over the ledger's Parquet files",
        metadata={"run_dir": str(run_dir)},
    )  # fmt: skip

    async def handle(req: Any) -> None:
        try:
            sql = str(json.loads(req.data or b"{}")["sql"])
        except (ValueError, KeyError, TypeError) as exc:
            reply: dict[str, Any] = {"ok": False, "error": f'request must be {{"sql": ...}}: {exc!r}'}
            return await req.respond(json.dumps(reply).encode())
        reply = await asyncio.to_thread(run_query, run_dir, sql)
        log.info("subject=%s query answered ok=%s: %.200s", S.LEDGER_QUERY, reply["ok"], sql)
        await req.respond(encode_reply(reply))

    await service.add_endpoint(name="query", subject=S.LEDGER_QUERY, handler=handle)
    return service


async def ask(url: str, sql: str, timeout_s: float = QUERY_TIMEOUT_S + 10) -> dict[str, Any]:
    """Send `sql` to the swarm's ledger at NATS `url` (operator credentials) and return its reply."""
    import nats.errors

    from swarmrl.services.common import bus

    nc = await bus.connect(url, "query")
    try:
        msg = await nc.request(S.LEDGER_QUERY, json.dumps({"sql": sql}).encode(), timeout=timeout_s)
    except nats.errors.NoRespondersError:
        return {
            "ok": False,
            "error": f"no ledger answers on {S.LEDGER_QUERY} (is one running on this swarm?)",
        }
    except nats.errors.TimeoutError:
        return {"ok": False, "error": f"no answer on {S.LEDGER_QUERY} within {timeout_s:g} s"}
    finally:
        await bus.close(nc)
    return dict(json.loads(msg.data))
