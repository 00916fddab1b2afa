"""`swarmrl research`: run a study of swarm runs and report on it, resumably.

    swarmrl research STUDY.toml [--dir DIR] [--parallel N] [--minutes M]   run a study
    swarmrl research --resume DIR                          go on after a kill, a crash or Ctrl-C
    swarmrl research --resume DIR --more-seeds N           add N seeds to a study and run them
    swarmrl research status DIR [--watch S]                progress, decisions and time left
    swarmrl research report DIR                            write report.md and the plots again
    swarmrl research --check STUDY.toml                    validate only
    swarmrl research --template                            print a commented study file
    swarmrl research --topic "..." --planner-url URL --planner-model NAME   an LLM writes the study

Runs share NATS servers with `--nats URL --nats-conf DIR` (each in NATS accounts of its own);
without, every run starts its own embedded server. README, "Research studies".
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import shutil
import sys
import time
from pathlib import Path

from swarmrl.research import state as S
from swarmrl.research.study import TEMPLATE, Budget, Study, StudyError, load_study

log = logging.getLogger("swarmrl.research")
TEMPLATE_HINT = "write the study yourself: `swarmrl research --template > my-study.toml` (example: studies/)"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="swarmrl research", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    add = p.add_argument
    add("study", nargs="?", type=Path, help="the study file (TOML)")
    add("--resume", type=Path, metavar="DIR", help="go on with the study in DIR")
    add("--more-seeds", type=int, metavar="N", help="with --resume: add N seeds (the next integers above the "
        "study's largest) to every arm still in it and run them; finished runs are kept")  # fmt: skip
    add("--check", action="store_true", help="validate the study file and exit")
    add("--template", action="store_true", help="print a commented study template and exit")
    add("--dir", type=Path, help="study directory (default runs/studies/<name>-<timestamp>)")
    add("--parallel", type=int, default=None, help="runs at once (default 1; each run takes its own cores)")
    add("--minutes", type=float, help="override [budget].run_minutes (a quick trial of a study)")
    add("--steps", type=int, help="override [budget].run_steps")
    add("--nats", default="", help="share these NATS servers (URL without password), one account per run")
    add("--nats-conf", type=Path, help="with --nats: their conf dir (see README, Multi-node)")
    add("--up-command", default="", help="the command that runs one swarm (default: this Python's "
        "`-m swarmrl.cli up`); research appends the run's flags. For wrappers and tests")  # fmt: skip
    add("--topic", help="a research topic: the planner LLM writes the study file")
    add("--planner-url", help="OpenAI-compatible endpoint of the planner (e.g. http://host:8000/v1)")
    add("--planner-model", help="the planner's model name")
    add("--planner-key-env", default="OPENAI_API_KEY", help="environment variable with the planner's API key")
    add("--plan-only", action="store_true", help="with --topic: write the study file, do not run it")
    return p


def setup_logging(study_dir: Path | None) -> None:
    from swarmrl.core.log import setup_logging as setup

    setup("research")
    if study_dir is not None:
        handler = logging.FileHandler(study_dir / "research.log")
        handler.setFormatter(logging.getLogger().handlers[0].formatter)
        logging.getLogger().addHandler(handler)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("status", "report"):
        return status(argv)
    p = parser()
    args = p.parse_args(argv)
    from swarmrl.core.config import password_on_command_line

    if reason := password_on_command_line(argv):
        p.error(reason)
    if args.template:
        print(TEMPLATE, end="")
        return 0
    if bool(args.nats) != (args.nats_conf is not None):
        p.error("--nats and --nats-conf go together")
    conf = args.nats_conf and args.nats_conf / "accounts.conf"
    if conf and not (conf.is_file() and 'include "runs.conf"' in conf.read_text()):
        p.error(f"{args.nats_conf}/accounts.conf does not include runs.conf: copy infra/nats/accounts.conf and "
                "infra/nats/runs.conf there (the servers then take one account pair per run)")  # fmt: skip
    if args.more_seeds is not None and (args.resume is None or args.more_seeds < 1):
        p.error("--more-seeds N goes with --resume DIR, N >= 1")
    if args.resume is not None:
        return resume(args)
    if args.topic:
        if not (args.planner_url and args.planner_model):
            return _fail(f"a topic needs a planner LLM (--planner-url URL --planner-model NAME, any "
                         f"OpenAI-compatible endpoint); or {TEMPLATE_HINT}")  # fmt: skip
        return planned(args)
    if args.study is None:
        p.error(f"give a study file, --resume DIR or --topic; {TEMPLATE_HINT}")
    try:
        study = overridden(load_study(args.study), args)
    except StudyError as exc:
        return _fail(str(exc))
    if args.check:
        print(f"{args.study}: valid; {len(study.arm_names)} arms x {len(study.seeds)} seeds = "
              f"{len(study.runs())} runs of {study.budget.run_minutes:g} min")  # fmt: skip
        return 0
    return start(study, args.study, args)


def _fail(message: str, rc: int = 2) -> int:
    print(f"swarmrl research: {message}", file=sys.stderr)
    return rc


def _study_dir(args: argparse.Namespace, name: str) -> Path:
    return (args.dir or Path("runs/studies") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}").resolve()


def overridden(study: Study, args: argparse.Namespace) -> Study:
    """The study with `--minutes` / `--steps` over its budget."""
    budget = study.budget.model_dump()
    if args.minutes is not None:
        budget["run_minutes"] = args.minutes
        if budget["total_minutes"] is not None:
            budget["total_minutes"] = max(budget["total_minutes"], args.minutes)
    if args.steps is not None:
        budget["run_steps"] = args.steps
    try:
        study.budget = Budget.model_validate(budget)
    except ValueError as exc:
        raise StudyError(f"--minutes/--steps: {exc}") from None
    return study


def start(study: Study, study_file: Path, args: argparse.Namespace) -> int:
    study_dir = _study_dir(args, study.name)
    if (study_dir / S.STATE).exists():
        return _fail(f"{study_dir} already holds a study; go on with --resume {study_dir}")
    study_dir.mkdir(parents=True, exist_ok=True)
    if study_file.resolve() != (study_dir / "study.toml").resolve():
        shutil.copyfile(study_file, study_dir / "study.toml")
    state = S.StudyState.new(
        study, study_file.resolve(), nats=args.nats, nats_conf=str(args.nats_conf.resolve()) if args.nats_conf else "",
        up_command=shlex.split(args.up_command),
    )  # fmt: skip
    S.save(study_dir, state)
    return execute(study_dir, state, args)


def resume(args: argparse.Namespace) -> int:
    study_dir = args.resume.resolve()
    try:
        state = S.load(study_dir)
    except (FileNotFoundError, ValueError) as exc:
        return _fail(f"cannot resume: {exc}")
    if args.nats:
        state.nats, state.nats_conf = args.nats, str(args.nats_conf.resolve())
    if args.up_command:
        state.up_command = shlex.split(args.up_command)
    if args.more_seeds:
        if S.is_locked(study_dir):
            return _fail(f"{study_dir} is being run by another process; add seeds once it stops")
        added = state.add_seeds(args.more_seeds)
        S.save(study_dir, state)
        print(f"swarmrl research: seeds {added} added; the study has {len(state.study.seeds)} seeds",
              flush=True)  # fmt: skip
    return execute(study_dir, state, args)


def execute(study_dir: Path, state: S.StudyState, args: argparse.Namespace) -> int:
    from swarmrl.research.report import write_report
    from swarmrl.research.runner import Runner

    try:
        lock = S.lock(study_dir)
    except RuntimeError as exc:
        return _fail(str(exc))
    setup_logging(study_dir)
    log.info("study %s (%s) in %s, pid %d", state.study.name, state.study.question, study_dir, os.getpid())
    with lock:  # held until the report is written
        state.parallel = args.parallel or state.parallel
        rc = Runner(study_dir, state, prepare_models=not state.up_command).run()
        report = write_report(study_dir, state)
    log.info("report: %s", report)
    print(f"swarmrl research: {'finished' if rc != 130 else 'stopped'}. Report: {report}", flush=True)
    return rc


def planned(args: argparse.Namespace) -> int:
    from swarmrl.research.planner import PlannerError, plan

    study_dir = _study_dir(args, "planned")
    study_dir.mkdir(parents=True, exist_ok=True)
    setup_logging(None)
    try:
        text, study = plan(args.topic, args.planner_url, args.planner_model,
                           os.environ.get(args.planner_key_env, ""), Path.cwd(),
                           transcript=study_dir / "planner.jsonl")  # fmt: skip
    except PlannerError as exc:
        return _fail(str(exc), rc=1)
    path = study_dir / "study.toml"
    path.write_text(text)
    print(f"swarmrl research: the planner wrote {path}", flush=True)
    if args.plan_only:
        return 0
    try:
        study = overridden(study, args)
    except StudyError as exc:
        return _fail(str(exc))
    args.dir = study_dir
    return start(study, path, args)


def render(study_dir: Path, state: S.StudyState, now: float | None = None) -> str:
    """`swarmrl research status DIR`: the progress, the decisions and an estimate of the time left."""
    from swarmrl.research.report import fmt
    from swarmrl.research.runner import progress

    now = time.time() if now is None else now
    live, study = S.is_locked(study_dir), state.study
    phase = "running" if live else f"stopped (go on: swarmrl research --resume {study_dir})"
    head = [
        f"study {study.name} in {study_dir}: {study.question}",
        f"state: {'finished' if state.finished else phase}; {state.tally()}",
    ]
    if not state.finished:
        head.append(
            f"time left: about {state.eta_s(now) / 60:.0f} min ({len(state.remaining())} run(s) to start, "
            f"{state.parallel} at once, ~{state.run_estimate_s() / 60:.1f} min a run)"
            + ("" if live else " once resumed")
        )
    for d in state.decisions:
        head.append(f"early stopping after {d.after_seeds} seed(s): kept {d.kept}, stopped {d.stopped}")
    rows = [f"{'run':<28} {'status':<8} {study.metric.label:>14} {'min':>6} {'tries':>5}  note / progress"]
    for r in state.ordered():
        last = r.attempts[-1] if r.attempts else None
        minutes = (r.duration_s or (now - last.started if last and r.status == "running" else 0)) / 60
        extra = r.note
        if last and r.status == "running":
            extra = progress(Path(last.run_dir)) if live else "interrupted: restarts on --resume"
        rows.append(
            f"{r.id:<28} {r.status:<8} {fmt(r.metric):>14} {minutes:>6.1f} {len(r.attempts):>5}  {extra}"
        )
    return "\n".join([*head, "", *rows])


def status(argv: list[str]) -> int:
    """`status DIR [--watch S]` prints `render` (again every S seconds until the study ends); `report
    DIR` writes `report.md` and the plots, also while the study runs."""
    p = argparse.ArgumentParser(prog=f"swarmrl research {argv[0]}", description=status.__doc__)
    p.add_argument("dir", type=Path, help="the study directory")
    if argv[0] == "status":
        p.add_argument("--watch", type=float, default=0, help="print again every WATCH seconds until it ends")
    args = p.parse_args(argv[1:])
    try:
        state = S.load(args.dir)
    except (FileNotFoundError, ValueError) as exc:
        return _fail(str(exc))
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


if __name__ == "__main__":
    sys.exit(main())
