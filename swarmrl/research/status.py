"""`swarmrl research status DIR` and `swarmrl research report DIR`: read a study's state, live or not.

`status` prints the progress and an estimate of the time left (`--watch S`: again every S seconds
until the study ends); `report` writes `report.md` and the plots, also while the study runs.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from swarmrl.research import processes, schedule
from swarmrl.research import state as S
from swarmrl.research.findings import fmt


def render(study_dir: Path, state: S.StudyState, now: float | None = None) -> str:
    now = time.time() if now is None else now
    live = S.is_locked(study_dir)
    counts = state.counts()
    study = state.study
    phase = "running" if live else f"stopped (go on: swarmrl research --resume {study_dir})"
    head = [
        f"study {study.name} in {study_dir}: {study.question}",
        f"state: {'finished' if state.finished else phase}; "
        f"{', '.join(f'{n} {s}' for s, n in sorted(counts.items()))} of {len(state.runs)} runs; "
        f"{state.elapsed_s / 60:.1f} min of running time",
    ]
    if not state.finished:
        left = schedule.eta_s(state, state.parallel, now)
        pending = len(schedule.remaining(state))
        head.append(
            f"time left: about {left / 60:.0f} min ({pending} run(s) to start, {state.parallel} at once, "
            f"~{schedule.run_estimate_s(state) / 60:.1f} min a run)" + ("" if live else " once resumed")
        )
    for d in state.decisions:
        head.append(f"early stopping after {d.after_seeds} seed(s): kept {d.kept}, stopped {d.stopped}")
    rows = [f"{'run':<28} {'status':<8} {study.metric.label:>14} {'min':>6} {'tries':>5}  note / progress"]
    for r in state.ordered():
        last = r.attempts[-1] if r.attempts else None
        minutes = (r.duration_s or (now - last.started if last and r.status == "running" else 0)) / 60
        extra = r.note
        if last and r.status == "running":
            extra = processes.progress(Path(last.run_dir)) if live else "interrupted: restarts on --resume"
        rows.append(
            f"{r.id:<28} {r.status:<8} {fmt(r.metric):>14} {minutes:>6.1f} {len(r.attempts):>5}  {extra}"
        )
    return "\n".join([*head, "", *rows])


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog=f"swarmrl research {argv[0]}", description=__doc__)
    p.add_argument("dir", type=Path, help="the study directory")
    if argv[0] == "status":
        p.add_argument("--watch", type=float, default=0, help="print again every WATCH seconds until it ends")
    args = p.parse_args(argv[1:])
    try:
        state = S.load(args.dir)
    except (FileNotFoundError, ValueError) as exc:
        print(f"swarmrl research: {exc}", file=sys.stderr)
        return 2
    if argv[0] == "report":
        from swarmrl.research.report import write_report

        print(write_report(args.dir, state))
        return 0
    while True:
        print(render(args.dir, state), flush=True)
        if not args.watch or state.finished or not S.is_locked(args.dir):
            return 0
        time.sleep(args.watch)
        print()
        state = S.load(args.dir)
