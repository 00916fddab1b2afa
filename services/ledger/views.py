"""DuckDB over the ledger's Parquet files: the views `swarmrl query` offers and the queries a restart needs.

Each table is a view over its `**/*.parquet` files (replicas' partition folders included,
`union_by_name`, so older files read a newer column as NULL); a table without files yet is a typed
empty SELECT. `episodes` is derived from `events` and `llm_calls` (its `task` is the name the merger
puts on samples); `groups` is `group_outcomes` plus the groups whose every episode was aborted.
"""

from __future__ import annotations

from pathlib import Path

import duckdb

from swarmrl.services.common.lifecycle import EpisodeState, EpisodeTracker
from swarmrl.services.ledger.store import ledger_dir
from swarmrl.services.ledger.tables import TABLES, duckdb_type

EPISODES_VIEW = """
CREATE OR REPLACE VIEW episodes AS
WITH begins AS (
    SELECT episode_id, task_id,
           CASE WHEN json_type(task, '$.name') = 'VARCHAR' THEN task->>'$.name' ELSE '' END AS task,
           coalesce(nullif(group_key, ''), task_id) AS group_key, client_id,
           client_version, models, agents, eval, ts AS begin_ts
    FROM events WHERE kind = 'begin'
), per_episode AS (
    SELECT episode_id,
           max(ts) FILTER (WHERE kind IN ('end', 'abort')) AS end_ts,
           bool_or(kind = 'end') AS ended,
           bool_or(kind = 'abort') AS aborted,
           coalesce(sum(value) FILTER (WHERE kind = 'reward'), 0.0) AS reward,
           count(*) AS n_events,
           max(ts) AS last_ts,
           any_value(reason) FILTER (WHERE kind = 'abort') AS abort_reason,
           any_value(metrics) FILTER (WHERE kind = 'end') AS metrics
    FROM events GROUP BY episode_id
), calls AS (
    SELECT episode_id, count(*) AS n_llm_calls, sum(n_prompt) AS prompt_tokens,
           sum(n_output) AS output_tokens, max(ts) AS last_llm_ts
    FROM llm_calls GROUP BY episode_id
)
SELECT b.episode_id, b.task_id, b.task, b.group_key, b.client_id, b.client_version, b.models, b.agents, b.eval,
       b.begin_ts, p.end_ts,
       CASE WHEN p.ended THEN 'ok' WHEN p.aborted THEN 'aborted' ELSE 'open' END AS status,
       p.reward,
       coalesce(c.n_llm_calls, 0) AS n_llm_calls,
       coalesce(c.prompt_tokens, 0) AS prompt_tokens,
       coalesce(c.output_tokens, 0) AS output_tokens,
       p.n_events + coalesce(c.n_llm_calls, 0) AS n_events,
       p.end_ts - b.begin_ts AS duration_s,
       greatest(p.last_ts, coalesce(c.last_llm_ts, p.last_ts)) AS last_ts,
       p.abort_reason, p.metrics
FROM begins b
JOIN per_episode p USING (episode_id)
LEFT JOIN calls c USING (episode_id)
"""

GROUPS_VIEW = """
CREATE OR REPLACE VIEW groups AS
SELECT group_key, task, client_id, model, outcome, reason, step, reward_std, episodes, ts FROM group_outcomes
UNION ALL
SELECT e.group_key, any_value(e.task), any_value(e.client_id), m.model, 'dropped', 'failed_episodes',
       NULL::BIGINT, NULL::DOUBLE, count(*), max(e.end_ts)
FROM episodes e, unnest(e.models) AS m(model)
WHERE NOT e.eval AND (e.group_key, m.model) NOT IN (SELECT group_key, model FROM group_outcomes)
GROUP BY e.group_key, m.model HAVING bool_and(e.status = 'aborted')
"""

VIEWS = (*TABLES, "episodes", "groups")


def quote(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def register_views(con: duckdb.DuckDBPyConnection, run_dir: Path | str, sub: str = "") -> None:
    """(Re)create every ledger view on `con` over `<run_dir>/ledger/`; `sub`: one partition folder only."""
    root = ledger_dir(run_dir)
    for table in TABLES:
        folder = root / table / sub if sub else root / table
        if folder.is_dir() and any(folder.rglob("*.parquet")):
            files = quote(str(folder / "**" / "*.parquet"))
            source = f"SELECT * FROM read_parquet({files}, union_by_name=true)"
        else:  # typed, without rows
            cols = ", ".join(f"NULL::{duckdb_type(f.type)} AS {f.name}" for f in TABLES[table])
            source = f"SELECT * FROM (SELECT {cols}) WHERE false"
        con.execute(f"CREATE OR REPLACE VIEW {table} AS {source}")
    con.execute(EPISODES_VIEW)
    con.execute(GROUPS_VIEW)


def high_water_marks(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    """Highest stream sequence written per stream, over every table."""
    parts = " UNION ALL ".join(
        f"SELECT stream, max(stream_seq) AS s FROM {t} GROUP BY stream" for t in TABLES
    )
    rows = con.execute(f"SELECT stream, max(s) FROM ({parts}) GROUP BY stream").fetchall()
    return {stream: int(seq) for stream, seq in rows if stream is not None and seq is not None}


def restore_tracker(con: duckdb.DuckDBPyConnection, tracker: EpisodeTracker) -> None:
    """Rebuild the ordering state from the written events, as if they had been replayed through `tracker`
    (rejected events were never written, so the rows are exactly the accepted history)."""
    closed = con.execute(
        "SELECT episode_id, kind FROM events WHERE kind IN ('end', 'abort') ORDER BY stream_seq DESC LIMIT ?",
        [tracker.max_closed],
    ).fetchall()
    for episode_id, kind in reversed(closed):
        tracker.close(episode_id, kind)
    open_rows = con.execute("""
        WITH open AS (
            SELECT episode_id, ts AS begin_ts FROM events WHERE kind = 'begin'
            AND episode_id NOT IN (SELECT episode_id FROM events WHERE kind IN ('end', 'abort'))
        ), seen AS (
            SELECT episode_id, client_id, seq, ts FROM events
            UNION ALL SELECT episode_id, client_id, seq, ts FROM llm_calls
        )
        SELECT o.episode_id, any_value(o.begin_ts), max(s.ts), list(s.client_id), list(s.seq)
        FROM open o JOIN (
            SELECT episode_id, client_id, max(seq) AS seq, max(ts) AS ts FROM seen GROUP BY ALL
        ) s USING (episode_id)
        GROUP BY o.episode_id
    """).fetchall()
    for episode_id, begin_ts, last_ts, clients, seqs in open_rows:
        tracker.open[episode_id] = EpisodeState(
            begin_ts=begin_ts, last_event_ts=last_ts, last_seq=dict(zip(clients, seqs, strict=True))
        )
