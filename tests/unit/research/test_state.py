"""The study state survives a crash at any write, and one process runs a study at a time."""

from __future__ import annotations

from pathlib import Path

import pytest

from swarmrl.research import state as S


def test_round_trip_and_atomic_writes(make_state, tmp_path: Path) -> None:
    st = make_state()
    st.runs["a-s1"].status = "done"
    st.runs["a-s1"].metric = 0.5
    S.save(tmp_path, st)
    S.save(tmp_path, st)
    back = S.load(tmp_path)
    assert back.runs["a-s1"].metric == 0.5 and back.study == st.study
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary left


def test_load_says_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no state.json"):
        S.load(tmp_path)


def test_one_process_at_a_time(tmp_path: Path) -> None:
    assert not S.is_locked(tmp_path)
    held = S.lock(tmp_path)
    assert S.is_locked(tmp_path)
    with pytest.raises(RuntimeError, match="being run by another process"):
        S.lock(tmp_path)
    held.close()  # as the kernel does when the process dies, however it dies
    assert not S.is_locked(tmp_path)
    S.lock(tmp_path).close()
