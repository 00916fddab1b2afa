"""Replay a recorded run's groups through the collapse guard (`services/trainer/guard.py`).

`python bench/guard_replay.py RUN_DIR [RUN_DIR ...] [--window N] [--drop D]` reads each run's ledger
(the groups' rewards, from `episodes`, and the oldest and newest policy versions of each group's
model calls, from `llm_calls`), feeds the groups to `RewardGuard` in the order they completed, as the
trainer would have, and prints when it would first have rolled back and to which version. It judges
guard settings on runs that collapsed and on runs that did not, without training again; a rollback
changes everything after it, so the first verdict is the only one a recorded run can tell.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from swarmrl.services.ledger.query import connect
from swarmrl.services.trainer.guard import RewardGuard


def groups(run_dir: Path) -> list[tuple[float, str, float, int, int]]:
    """(completion time in s since the first group, group key, mean reward, oldest and newest
    generating version) of every whole training group of the run, in completion order (evaluation
    episodes left out)."""
    con = connect(run_dir)
    rows = con.sql(
        """
        with calls as (
          select episode_id, min(policy_version) as oldest, max(policy_version) as newest
          from llm_calls where policy_version >= 0 group by episode_id
        )
        select e.group_key, max(e.end_ts) as done, avg(e.reward) as reward, min(c.oldest), max(c.newest)
        from episodes e join calls c using (episode_id)
        where e.status = 'ok' and not coalesce(e.eval, false) and e.group_key is not null
        group by e.group_key
        order by done
        """
    ).fetchall()
    if not rows:
        raise SystemExit(f"{run_dir}: no ended training episodes in its ledger")
    t0 = rows[0][1]
    return [(float(done - t0), key, float(r), int(old), int(new)) for key, done, r, old, new in rows]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", type=Path, nargs="+", help="run directories with a ledger (runs/<name>)")
    p.add_argument("--window", type=int, default=16, help="rollback_window (default 16)")
    p.add_argument("--drop", type=float, default=0.5, help="rollback_drop (default 0.5)")
    a = p.parse_args()
    for run_dir in a.runs:
        found = groups(run_dir)
        guard = RewardGuard(a.window, a.drop)
        verdict = "no rollback"
        for at, _key, reward, oldest, newest in found:
            target = guard.observe(oldest, newest, reward)
            if target is not None:
                lo, hi = min(old for old, _, _ in guard.recent), max(new for _, new, _ in guard.recent)
                verdict = (
                    f"at {at / 60:.2f} min groups of versions {lo}-{hi} averaged {guard.mean():.3f} against "
                    f"the best window's {guard.best:.3f}: roll back to version {target}"
                )
                break
        print(
            f"{run_dir}: {len(found)} groups over {found[-1][0] / 60:.1f} min, window {a.window}, drop "
            f"{a.drop}: {verdict}"
        )


if __name__ == "__main__":
    main()
