import re
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from swarmrl.schemas import AbortEvent, BeginEvent, encode
from swarmrl.schemas import subjects as S
from swarmrl.services.common.lifecycle import EpisodeTracker
from swarmrl.services.ledger.columns import to_arrow
from swarmrl.services.ledger.ingest import Ingest, Rejected
from swarmrl.services.ledger.query import connect
from swarmrl.services.ledger.store import PartWriter
from swarmrl.services.ledger.tables import TABLES
from swarmrl.services.ledger.views import VIEWS, high_water_marks, restore_tracker
from tests.unit.ledger.factories import episode


def _ingest_all(ingest: Ingest, events, start_seq: int = 1) -> dict[str, pa.Table]:
    rows: dict[str, list] = {}
    for i, ev in enumerate(events, start=start_seq):
        table, row = ingest.episode(S.episode_subject(ev.episode_id, ev.kind), encode(ev), "EPISODES", i, 0.0)
        rows.setdefault(table, []).append(row)
    return {table: to_arrow(table, r) for table, r in rows.items()}


def test_views_on_a_fresh_run_dir_are_empty_and_typed(tmp_path: Path) -> None:
    con = connect(tmp_path)
    for view in VIEWS:
        assert con.execute(f"SELECT count(*) FROM {view}").fetchone() == (0,)
    cols = dict(con.execute("SELECT column_name, column_type FROM (DESCRIBE llm_calls)").fetchall())
    assert cols["prompt_ids"] == "BIGINT[]" and cols["output_logprobs"] == "DOUBLE[]"
    assert high_water_marks(con) == {}


def test_missing_run_dir_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nope"):
        connect(tmp_path / "nope")


def test_written_rows_show_in_views_and_the_episodes_view(tmp_path: Path) -> None:
    writer = PartWriter(tmp_path)
    writer.prepare()
    con = connect(tmp_path)  # opened before any rows: the views must still see later files
    ingest = Ingest()
    events = episode("ok1", reward=1.5, calls=2) + episode("open1", end=False)
    events.append(BeginEvent(episode_id="ab1", seq=0, client_id="c", task_id="t", group_key="g"))
    events.append(AbortEvent(episode_id="ab1", seq=1, client_id="c", reason="sandbox died"))
    writer.write_group(_ingest_all(ingest, events))
    got = {
        r[0]: r[1:]
        for r in con.execute(
            "SELECT episode_id, status, reward, n_llm_calls, group_key, abort_reason FROM episodes"
        ).fetchall()
    }
    assert got == {
        "ok1": ("ok", 1.5, 2, "arith-3", None),
        "open1": ("open", 1.0, 1, "arith-3", None),
        "ab1": ("aborted", 0.0, 0, "g", "sandbox died"),
    }
    assert con.execute("SELECT output_ids FROM llm_calls WHERE episode_id='ok1' ORDER BY seq").fetchall() == [
        ([7, 8, 2**40],),
        ([7, 8, 2**40],),
    ]
    assert high_water_marks(con) == {"EPISODES": len(events)}


def test_restored_tracker_accepts_what_the_original_would(tmp_path: Path) -> None:
    writer = PartWriter(tmp_path)
    writer.prepare()
    before = Ingest()
    writer.write_group(_ingest_all(before, episode("done") + episode("going", end=False)))
    after = Ingest(EpisodeTracker())
    with duckdb.connect() as con:
        from swarmrl.services.ledger.views import register_views

        register_views(con, tmp_path)
        restore_tracker(con, after.tracker)
    assert after.tracker.open.keys() == before.tracker.open.keys() == {"going"}
    assert after.tracker.open["going"].last_seq == before.tracker.open["going"].last_seq
    assert dict(after.tracker.closed) == {"done": "end"}
    end = episode("going")[-1]
    after.episode(S.episode_subject("going", "end"), encode(end), "EPISODES", 99, 0.0)  # accepted
    with pytest.raises(Rejected, match="after_end"):
        after.episode(S.episode_subject("done", "end"), encode(episode("done")[-1]), "EPISODES", 100, 0.0)


def test_incomplete_flush_group_and_tmp_files_are_removed(tmp_path: Path) -> None:
    writer = PartWriter(tmp_path)
    writer.prepare()
    rows = _ingest_all(Ingest(), episode("e1"))
    paths = writer.write_group(rows)
    assert len(paths) == 2  # events + llm_calls
    kept = writer.write_group(_ingest_all(Ingest(), episode("e2")))
    paths[0].unlink()  # as if killed between the two renames of the first group
    (writer.root / "events" / "part-x.parquet.tmp").write_bytes(b"junk")
    removed = PartWriter(tmp_path).prepare()
    assert sorted(removed) == sorted([paths[1], writer.root / "events" / "part-x.parquet.tmp"])
    assert all(p.exists() for p in kept)
    assert connect(tmp_path).execute("SELECT DISTINCT episode_id FROM events").fetchall() == [("e2",)]


def test_every_table_has_a_view() -> None:
    assert set(TABLES) < set(VIEWS)


def test_readme_documents_every_column_of_every_view(tmp_path: Path) -> None:
    readme = (Path(__file__).parents[3] / "services" / "ledger" / "README.md").read_text()
    con = connect(tmp_path)
    for view in VIEWS:
        section = readme.split(f"### `{view}`", 1)[1].split("\n### ", 1)[0]
        for (column,) in con.execute(f"SELECT column_name FROM (DESCRIBE {view})").fetchall():
            assert f"| `{column}` |" in section, f"{view}.{column} is not documented in README.md"


def test_readme_tables_match_the_views_column_for_column(tmp_path: Path) -> None:
    """The README's table of each view lists exactly its columns, in order, with DuckDB's types."""
    readme = (Path(__file__).parents[3] / "services" / "ledger" / "README.md").read_text()
    con = connect(tmp_path)
    for view in VIEWS:
        section = readme.split(f"### `{view}`", 1)[1].split("\n### ", 1)[0]
        documented = re.findall(r"^\| `([^`]+)` \| ([A-Z][A-Z\[\]]*) \|", section, re.M)
        actual = [(name, kind) for name, kind, *_ in con.execute(f"DESCRIBE {view}").fetchall()]
        assert documented == actual, (
            f"services/ledger/README.md, `{view}`: documented {documented}, schema {actual}"
        )


def test_the_episodes_view_names_each_episodes_task(tmp_path: Path) -> None:
    writer = PartWriter(tmp_path)
    writer.prepare()
    events = episode("named") + [
        BeginEvent(episode_id="nameless", seq=0, client_id="c", task_id="t"),
        BeginEvent(episode_id="numbered", seq=0, client_id="c", task_id="t", task={"name": 7}),
    ]
    writer.write_group(_ingest_all(Ingest(), events))
    got = dict(connect(tmp_path).execute("SELECT episode_id, task FROM episodes").fetchall())
    # as the merger names a sample's task: begin's task["name"] when it is a string, else ""
    assert got == {"named": "arith", "nameless": "", "numbered": ""}
