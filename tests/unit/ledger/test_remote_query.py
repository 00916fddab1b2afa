"""The ledger's answers to SQL over NATS (`services/ledger/remote.py`), without NATS: what a query may
read and run, and how its reply travels."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from swarmrl.services.ledger.remote import MAX_REPLY_BYTES, encode_reply, run_query
from tests.unit.ledger.factories import dead_letter_run


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return dead_letter_run(tmp_path / "run")


def test_a_select_is_answered_with_columns_rows_and_bytes_as_base64(run_dir: Path) -> None:
    reply = run_query(run_dir, "SELECT service, code, data FROM dead_letters")
    assert reply["ok"], reply
    assert reply["columns"] == ["service", "code", "data"]
    assert json.loads(encode_reply(reply))["rows"] == [["merger", "malformed", "wQA="]]
    assert run_query(run_dir, "DESCRIBE episodes")["ok"]


@pytest.mark.parametrize(
    "sql",
    [
        "COPY (SELECT 1) TO 'out.csv'",
        "CREATE TABLE t AS SELECT 1",
        "ATTACH 'other.db'",
        "SELECT 1; SELECT 2",
        "SET enable_external_access = true",
    ],
)
def test_only_one_reading_statement_runs(run_dir: Path, sql: str) -> None:
    reply = run_query(run_dir, sql)
    assert not reply["ok"] and "reading statement" in reply["error"]


def test_a_query_reads_nothing_outside_the_ledger(run_dir: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.csv"
    secret.write_text("password\nhunter2\n")
    reply = run_query(run_dir, f"SELECT * FROM read_csv('{secret}')")
    assert not reply["ok"] and "hunter2" not in json.dumps(reply)
    assert "Permission" in reply["error"], reply


def test_errors_and_oversized_results_come_back_as_errors(run_dir: Path) -> None:
    assert "Parser" in run_query(run_dir, "SELEC nonsense")["error"]
    big = run_query(run_dir, f"SELECT repeat('x', {MAX_REPLY_BYTES}) AS x")
    assert big["ok"]
    refused = json.loads(encode_reply(big))
    assert not refused["ok"] and "add a LIMIT" in refused["error"]
