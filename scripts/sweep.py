"""Hyperparameter sweeps: an Optuna study over one learning-dashboard row (CleanRL's Tuner, RL
Zoo's --optimize).

Each trial samples the --param values, runs the row's experiment once per seed, one run after
another, exactly as scripts/bench_learning.py runs it (a subprocess of its own session, the
row's and the mode's flags, --seed, --logdir, --no-progress, --overwrite, then the sampled
values as flags, then --extra), and scores the trial by the mean over seeds of one figure per run:
  held   (default) min(final evaluation, mean of the last 5 evaluations): the return the run
         ended at and stayed at. A run that peaks and falls back scores its fall; one that
         climbs only at its last evaluation scores its last-5 mean. bench_learning's 'held' is
         exactly held >= the row's hold threshold, so this is its graded form.
  auc    the mean evaluation return over training (bench_learning's AUC): rewards learning
         fast as well as well.
  final  the final evaluation (after the run's last update): the cheapest to game by luck.
After each seed but the last, the mean so far is reported to Optuna; the MedianPruner stops the
trial when it is below the median of earlier trials at the same seed count (after
--prune-startup-trials trials have finished; --no-prune: never).

The study lives in an SQLite file (--study PATH.db); the trials' runs, trials.md and best.json
go in the directory beside it named after it (runs/sweeps/dqn-acrobot.db ->
runs/sweeps/dqn-acrobot/trial0003/runs/<row>/<mode>/seed<S>). Rerunning the same command continues
the study until --trials trials have finished (completed, pruned, or failed because a run
failed): a trial that was running when its sweep was killed, or stopped by Ctrl-C, is marked
failed and its values are queued to run again; finished trials are kept. One sweep process per
study at a time (a lock beside it). A run that fails (non-zero exit, past --timeout seconds,
no evaluation) fails its trial and the sweep goes on; one whose experiment refuses its flags
(exit 2, a usage error) stops the sweep. Ctrl-C (or SIGTERM / SIGHUP) stops the current run
with it; kill -9 of the sweep leaves that run going to its end (its own session).

--param NAME=KIND:SPEC, repeatable; NAME is the experiment's flag without its dashes:
  log:LO:HI       a float, sampled uniformly in log space (learning rates)
  float:LO:HI     a float, uniformly
  int:LO:HI       an integer, both ends included
  choice:A,B,...  one of the values (ints, floats, true/false or words); true/false give the
                  flag alone or its --...no-... form (--agent.dueling / --agent.no-dueling)
A field of a subcommand (agent.loss.num-q-networks) goes right after that subcommand in
--extra (--extra "agent.loss:q-learning"), where tyro reads it; every other value goes before
--extra.

At the end, and with --report STUDY alone, a table of the trials (values, objective, the
per-seed figures) and the best trial's command line are printed and written to trials.md and
best.json.

  python scripts/sweep.py --row dqn-acrobot --mode sync --seeds 0-2 --trials 20 \\
      --study runs/sweeps/dqn-acrobot.db \\
      --param agent.learning-rate=log:1e-4:3e-3 --param agent.n-step=int:1:5
  python scripts/sweep.py --report --study runs/sweeps/dqn-acrobot.db

Needs Optuna: pip install -e ".[sweep]".
"""

from __future__ import annotations

import argparse
import dataclasses
import fcntl
import json
import re
import shlex
import signal
import statistics
import sys
import threading
from pathlib import Path
from typing import Any, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_learning as bl  # noqa: E402  (scripts/ is not a package)

METRICS = ("held", "auc", "final")
KINDS = "log:LO:HI, float:LO:HI, int:LO:HI or choice:A,B,..."
USAGE_ERROR = 2  # the exit status of an argparse / tyro usage error: the flags are wrong


class RunFailed(Exception):
  """A run of the trial failed: the trial fails, the sweep goes on."""


class SweepError(Exception):
  """The sweep cannot go on (one line, naming the fix)."""


def require_optuna():
  try:
    import optuna
  except ImportError:
    sys.exit('error: sweeps need Optuna: pip install -e ".[sweep]"')
  return optuna


# --- parameters -----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Param:
  name: str
  """the experiment's flag without its dashes: agent.learning-rate."""
  kind: str
  """log, float, int or choice."""
  low: float | int | None = None
  high: float | int | None = None
  choices: tuple = ()
  spec: str = ""
  """as given: NAME=KIND:SPEC."""

  def suggest(self, trial) -> Any:
    if self.kind == "choice":
      return trial.suggest_categorical(self.name, list(self.choices))
    if self.kind == "int":
      return trial.suggest_int(self.name, self.low, self.high)
    return trial.suggest_float(self.name, self.low, self.high, log=self.kind == "log")


def parse_value(word: str):
  """A choice as the value it names: "128" -> 128, "3e-4" -> 0.0003, "true" -> True, else the
  word (Optuna stores them so, and the table shows them so)."""
  if word.lower() in ("true", "false"):
    return word.lower() == "true"
  for cast in (int, float):
    try:
      return cast(word)
    except ValueError:
      pass
  return word


def _number(word: str, cast, spec: str):
  try:
    return cast(word)
  except ValueError:
    raise argparse.ArgumentTypeError(
        f"{word!r} in {spec!r} is not {'an integer' if cast is int else 'a number'}") from None


def parse_param(spec: str) -> Param:
  """NAME=KIND:SPEC as a Param; argparse.ArgumentTypeError (one line: what is wrong and how to
  write it) for a malformed one."""
  name, eq, rest = spec.partition("=")
  kind, colon, values = rest.partition(":")
  if not eq or not colon:
    raise argparse.ArgumentTypeError(
        f"{spec!r}: write NAME=KIND:SPEC with KIND:SPEC {KINDS}, e.g. "
        "agent.learning-rate=log:1e-4:3e-3")
  if not re.fullmatch(r"[A-Za-z][\w.-]*", name):
    raise argparse.ArgumentTypeError(
        f"{spec!r}: NAME is the experiment's flag without its dashes, e.g. agent.batch-size")
  if kind == "choice":
    words = values.split(",")
    if not all(words) or len(set(words)) != len(words):
      raise argparse.ArgumentTypeError(
          f"{spec!r}: choice takes distinct comma-separated values, e.g. choice:64,128,256")
    return Param(name, kind, choices=tuple(parse_value(w) for w in words), spec=spec)
  if kind not in ("log", "float", "int"):
    raise argparse.ArgumentTypeError(f"{spec!r}: unknown kind {kind!r}; give {KINDS}")
  bounds = values.split(":")
  if len(bounds) != 2:
    raise argparse.ArgumentTypeError(f"{spec!r}: {kind} takes two bounds, {kind}:LO:HI")
  cast = int if kind == "int" else float
  low, high = (_number(b, cast, spec) for b in bounds)
  if not low < high:
    raise argparse.ArgumentTypeError(f"{spec!r}: LO must be below HI")
  if kind == "log" and low <= 0:
    raise argparse.ArgumentTypeError(f"{spec!r}: log bounds must be above 0")
  return Param(name, kind, low, high, spec=spec)


def parse_params(specs: Sequence[str]) -> list[Param]:
  params = [parse_param(s) for s in specs]
  names = [p.name for p in params]
  twice = sorted({n for n in names if names.count(n) > 1})
  if twice:
    raise argparse.ArgumentTypeError(f"{', '.join(twice)} given more than once; give each once")
  return params


def flag_words(name: str, value) -> list[str]:
  """One value as the experiment's flag: ["--agent.batch-size", "128"]; a bool as tyro's flag
  alone, ["--agent.dueling"] or ["--agent.no-dueling"]; floats in repr, which reads back the
  same float."""
  if isinstance(value, bool):
    parent, dot, field = name.rpartition(".")
    return [f"--{parent}{dot}{'' if value else 'no-'}{field}"]
  return [f"--{name}", repr(value) if isinstance(value, float) else str(value)]


def run_flags(values: dict, extra: Sequence[str]) -> list[str]:
  """The sampled values as flags, merged with --extra's words: before them, except a field of a
  subcommand named in --extra (agent.loss.num-q-networks, with agent.loss:q-learning), which
  goes right after that subcommand: tyro takes a subcommand's flags only after it, and every
  subcommand after the other flags."""
  head, tail = [], list(extra)
  for name, value in values.items():
    parent = name.rpartition(".")[0]
    at = next((i for i, w in enumerate(tail) if parent and w.startswith(parent + ":")), None)
    if at is None:
      head += flag_words(name, value)
    else:
      tail[at + 1:at + 1] = flag_words(name, value)
  return head + tail


# --- scoring --------------------------------------------------------------------------------------
def run_score(record: dict) -> dict:
  """The figures a trial can be scored by, from one run's bench_learning.collect record:
  held = min(final, last-5 mean), auc, final (all None without evaluations)."""
  final, last5 = record.get("final"), record.get("last5")
  held = None if final is None or last5 is None else min(final, last5)
  return {"held": held, "auc": record.get("auc"), "final": final}


# --- the study ------------------------------------------------------------------------------------
def sweep_dir(study_path: Path) -> Path:
  """Where a study's runs, trials.md and best.json go: beside it, named after it."""
  return study_path.with_suffix("")


def storage_url(study_path: Path) -> str:
  return f"sqlite:///{study_path.resolve()}"


def settings_of(args: argparse.Namespace) -> dict:
  """What the study's trials depend on: a resume with others would mix them in one table."""
  return {"row": args.row, "mode": args.mode, "seeds": args.seeds, "metric": args.metric,
          "extra": args.extra, "params": [p.spec for p in args.params]}


def open_study(optuna, study_path: Path, settings: dict | None, pruner=None, sampler=None):
  """The study in ``study_path``, created when missing (with ``settings`` as its user attrs);
  ``settings`` None: it must exist (--report). SweepError when the settings differ from the
  study's and some trial has finished under them."""
  if settings is None and not study_path.exists():
    raise SweepError(f"no study at {study_path}; start one with --row ... --param ...")
  study_path.parent.mkdir(parents=True, exist_ok=True)
  storage = optuna.storages.RDBStorage(storage_url(study_path))
  study = optuna.create_study(storage=storage, study_name=study_path.stem, direction="maximize",
                              load_if_exists=True, pruner=pruner, sampler=sampler)
  saved = study.user_attrs.get("settings")
  if settings is None:
    if saved is None:
      raise SweepError(f"{study_path} holds no sweep's settings; was it made by scripts/sweep.py?")
    return study, storage
  if saved is not None and saved != settings:
    if any(counted(t) for t in study.get_trials(deepcopy=False)):
      differ = ", ".join(f"{k} {saved.get(k)!r}" for k in settings if settings[k] != saved.get(k))
      raise SweepError(f"{study_path} was run with {differ}; rerun with those to continue it, "
                       "or name a new --study")
  study.set_user_attr("settings", settings)
  return study, storage


def requeue_stopped(optuna, study, storage) -> list[int]:
  """Marks the trials a killed sweep left running as failed, and queues the values of those and
  of trials stopped by Ctrl-C to run again (once). Only safe while no other sweep runs this study
  (the caller holds its lock). Returns the numbers of the trials queued again."""
  TrialState = optuna.trial.TrialState
  trials = study.get_trials(deepcopy=False)
  retried = {t.user_attrs.get("retry_of") for t in trials}
  study_id = storage.get_study_id_from_name(study.study_name)
  queued = []
  for t in trials:
    if t.state == TrialState.RUNNING:
      trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, t.number)
      storage.set_trial_user_attr(trial_id, "interrupted", "its sweep was killed")
      storage.set_trial_state_values(trial_id, TrialState.FAIL)
    elif not (t.state == TrialState.FAIL and t.user_attrs.get("interrupted")):
      continue
    if t.number not in retried:
      study.enqueue_trial(t.params, user_attrs={"retry_of": t.number})
      queued.append(t.number)
  return queued


def counted(trial) -> bool:
  """A trial that counts towards --trials (and a study's settings): finished, neither stopped
  by its sweep's end nor refused by the experiment."""
  return (trial.state.is_finished() and not trial.user_attrs.get("interrupted")
          and not trial.user_attrs.get("refused"))


class StudyLock:
  """An exclusive lock beside the study, held while a sweep runs it; the OS lets go of it when
  the process ends, kill -9 included, so a lock that can be taken means no sweep is running."""

  def __init__(self, path: Path):
    self.path = path

  def __enter__(self):
    self.path.parent.mkdir(parents=True, exist_ok=True)
    self.file = open(self.path, "a+")
    try:
      fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      self.file.close()
      raise SweepError(f"another sweep is running this study ({self.path} is locked); wait for "
                       "it or stop it") from None
    return self

  def __exit__(self, *exc):
    self.file.close()


def row_command(settings: dict, values: dict) -> list[str]:
  """The experiment's command line for ``values`` (no --seed: the seeds are listed beside it)."""
  row = bl.ROWS[settings["row"]]
  return [*(f"{k}={v}" for k, v in row.env), "python", row.script, *row.flags,
          *bl.MODES[settings["mode"]], *run_flags(values, settings["extra"])]


def rerun_command(settings: dict, command: list[str], config: Path) -> list[str]:
  """``command`` (``row_command``'s) as a rerun of a saved run: the row's ``VAR=value``
  words, python and the script, then ``--config config``."""
  script = len(bl.ROWS[settings["row"]].env) + 2
  return [*command[:script], "--config", str(config)]


def make_objective(optuna, settings: dict, params: list[Param], out: Path, timeout: float,
                   git: dict):
  """The trial function: sample, run each seed in turn, report, prune, score."""
  metric, seeds = settings["metric"], settings["seeds"]

  def objective(trial) -> float:
    values = {p.name: p.suggest(trial) for p in params}
    extra = run_flags(values, settings["extra"])
    jobs = bl.build_jobs([settings["row"]], [settings["mode"]], seeds,
                         out / f"trial{trial.number:04d}", extra)
    shown = ", ".join(f"{k}={fmt_value(v)}" for k, v in values.items())
    runs, scores = [], []
    for step, job in enumerate(jobs):
      try:
        status = bl.execute(job, timeout, git)
      except KeyboardInterrupt:
        trial.set_user_attr("interrupted", "Ctrl-C")
        raise
      record = bl.collect(job)
      score = run_score(record)
      runs.append({"seed": job.seed, "logdir": str(job.logdir), "command": job.command,
                   "failed": record["failed"], **score,
                   "env_steps": record["total_env_steps"], "wall_s": status["process_wall_s"]})
      trial.set_user_attr("runs", runs)
      if record["failed"] or score[metric] is None:
        why = record.get("why", "no evaluation")
        log = job.logdir / "log.txt"
        print(f"trial {trial.number} ({shown}) seed {job.seed}: FAILED ({why}); {log}:\n"
              f"{record.get('log_tail', '')}", flush=True)
        if record.get("returncode") == USAGE_ERROR:
          trial.set_user_attr("refused", True)
          raise SweepError(f"the experiment refused its flags (exit 2, a usage error; {log}): "
                           "fix --param / --extra")
        trial.set_user_attr("failed", f"seed {job.seed}: {why}")
        raise RunFailed(f"seed {job.seed}: {why}, {log}")
      scores.append(score[metric])
      mean = statistics.fmean(scores)
      print(f"trial {trial.number} ({shown}) seed {job.seed}: {metric} "
            f"{bl.fmt_return(score[metric])}, mean so far {bl.fmt_return(mean)}; "
            f"{bl.fmt_steps(record['total_env_steps'])} env steps, "
            f"{status['process_wall_s']:.0f} s", flush=True)
      if step < len(jobs) - 1:
        trial.report(mean, step)
        if trial.should_prune():
          print(f"trial {trial.number}: pruned after {step + 1} seed(s)", flush=True)
          raise optuna.TrialPruned()
    return statistics.fmean(scores)

  return objective


# --- reporting ------------------------------------------------------------------------------------
def fmt_value(v) -> str:
  return f"{v:.3g}" if isinstance(v, float) else str(v)


def trial_line(optuna, t, settings: dict, best_number: int | None) -> str:
  """One trial's table row: number, state, objective, values, the per-seed figures."""
  TrialState = optuna.trial.TrialState
  runs = {r["seed"]: r for r in t.user_attrs.get("runs", [])}
  metric = settings["metric"]
  per_seed = [bl.fmt_return(runs[s][metric]) if s in runs and not runs[s]["failed"] else
              "failed" if s in runs else "-" for s in settings["seeds"]]
  state = {TrialState.COMPLETE: "complete", TrialState.PRUNED: f"pruned ({len(runs)} seeds)",
           TrialState.RUNNING: "running", TrialState.WAITING: "queued"}.get(
               t.state, f"failed ({t.user_attrs.get('failed', '?')})")
  if t.state == TrialState.FAIL and t.user_attrs.get("interrupted"):
    state = f"stopped: {t.user_attrs['interrupted']}"
  if t.user_attrs.get("refused"):
    state = "failed: the experiment refused its flags"
  if t.user_attrs.get("retry_of") is not None:
    state += f", rerun of {t.user_attrs['retry_of']}"
  mark = " *" if t.number == best_number else ""
  values = [fmt_value(t.params[p]) if p in t.params else "-" for p in param_names(settings)]
  return (f"| {t.number}{mark} | {state} | {bl.fmt_return(t.value)} | " + " | ".join(values)
          + " | " + " | ".join(per_seed) + " |")


def param_names(settings: dict) -> list[str]:
  return [s.partition("=")[0] for s in settings["params"]]


def best_record(optuna, study, settings: dict) -> dict | None:
  """best.json's content: the best completed trial's values, objective, runs, command and
  the config.json that reruns it (``--config``)."""
  done = [t for t in study.get_trials(deepcopy=False)
          if t.state == optuna.trial.TrialState.COMPLETE]
  if not done:
    return None
  best = study.best_trial
  command = row_command(settings, best.params)
  # The first seed's run of the best trial saved every setting it ran with: the experiment
  # reruns it from that file (--config), with --seed S for another seed.
  config = Path(best.user_attrs["runs"][0]["logdir"]) / "config.json"
  rerun = rerun_command(settings, command, config) if config.is_file() else None
  return {"study": study.study_name, "trial": best.number, "metric": settings["metric"],
          "objective": best.value, "params": best.params, "seeds": settings["seeds"],
          "command": shlex.join(command), "argv": command,
          "config": str(config) if rerun else None, "rerun": shlex.join(rerun) if rerun else None,
          "runs": [{"seed": r["seed"], settings["metric"]: r[settings["metric"]],
                    "command": shlex.join(r["command"])} for r in best.user_attrs["runs"]],
          "settings": settings}


def report(optuna, study, study_path: Path) -> str:
  """The trials' table and the best trial's command; writes trials.md and best.json."""
  settings = study.user_attrs["settings"]
  best = best_record(optuna, study, settings)
  metric = settings["metric"]
  names = param_names(settings)
  seeds = settings["seeds"]
  lines = [f"# sweep {study.study_name}: {settings['row']}, {settings['mode']}, seeds "
           f"{bl.format_seeds(seeds)}, objective: mean {metric} over seeds", "",
           f"| trial | state | objective | {' | '.join(names)} | "
           + " | ".join(f"{metric} seed {s}" for s in seeds) + " |",
           "|---" * (3 + len(names) + len(seeds)) + "|"]
  lines += [trial_line(optuna, t, settings, best and best["trial"])
            for t in study.get_trials(deepcopy=False)]
  if best is None:
    lines += ["", "No trial has completed yet."]
  else:
    lines += ["", f"Best: trial {best['trial']}, {metric} {bl.fmt_return(best['objective'])} "
              f"(mean over seeds {bl.format_seeds(seeds)}); add --seed S:",
              "", f"    {best['command']}"]
    if best["rerun"]:
      lines += ["", "or from the saved config of its first seed's run (flags given override it):",
                "", f"    {best['rerun']} --seed S"]
  md = "\n".join(lines) + "\n"
  out = sweep_dir(study_path)
  out.mkdir(parents=True, exist_ok=True)
  (out / "trials.md").write_text(md)
  if best is not None:
    (out / "best.json").write_text(json.dumps(best, indent=1))
  return md


# --- main -----------------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--study", required=True, help="the study's SQLite file (created if missing)")
  p.add_argument("--report", action="store_true",
                 help="print the table and the best command of --study, run nothing")
  p.add_argument("--row", choices=list(bl.ROWS), help="bench_learning's row to tune")
  p.add_argument("--mode", choices=list(bl.MODES), default="sync", help="bench_learning's mode")
  p.add_argument("--seeds", nargs="+", default=["0-2"], help=bl.SEEDS_HELP)
  p.add_argument("--trials", type=int, default=20,
                 help="trials the study should hold once finished (earlier runs' count)")
  p.add_argument("--param", action="append", default=[], metavar="NAME=KIND:SPEC",
                 help=f"a flag to tune (repeatable); KIND:SPEC {KINDS}")
  p.add_argument("--metric", choices=METRICS, default="held", help="each run's figure")
  p.add_argument("--extra", action="append", default=[],
                 help="flags for every run, split like a shell line (repeatable); one flag "
                      "alone needs the '=': --extra=--agent.no-layer-norm")
  p.add_argument("--timeout", type=float, default=900.0,
                 help="seconds per run before it is killed and its trial fails")
  p.add_argument("--max-time", type=float, default=None,
                 help="seconds after which no new trial starts (the one running ends first)")
  p.add_argument("--no-prune", action="store_true", help="run every trial on every seed")
  p.add_argument("--prune-startup-trials", type=int, default=5,
                 help="trials finished before any is pruned")
  p.add_argument("--sampler-seed", type=int, default=None, help="TPE's seed")
  args = p.parse_args(argv)
  if not Path(args.study).suffix:  # the runs go in the path without it
    p.error(f"argument --study: name a file with a suffix, e.g. {args.study}.db")
  if args.report:
    return args
  if args.row is None or not args.param:
    p.error("a sweep needs --row and at least one --param (or --report to show a study)")
  if args.trials < 1:
    p.error("argument --trials: give 1 or more")
  try:
    args.seeds = bl.parse_seeds(args.seeds)
  except argparse.ArgumentTypeError as e:
    p.error(f"argument --seeds: {e}")
  try:
    args.params = parse_params(args.param)
  except argparse.ArgumentTypeError as e:
    p.error(f"argument --param: {e}")
  args.extra = [w for chunk in args.extra for w in shlex.split(chunk)]
  # A tuned flag also in --extra would win over the sampled value (the last flag wins): every
  # trial would run the same setting.
  both = sorted({p.name for p in args.params}
                & {w[2:].split("=")[0].replace("_", "-") for w in args.extra if w.startswith("--")})
  if both:
    p.error(f"--param and --extra both set {', '.join(both)}: the --extra value would win in "
            "every trial; drop it from --extra.")
  return args


def run_sweep(optuna, args: argparse.Namespace, study_path: Path) -> bool:
  """Runs the study to --trials finished trials; True if stopped by Ctrl-C."""
  pruner = (optuna.pruners.NopPruner() if args.no_prune else
            optuna.pruners.MedianPruner(n_startup_trials=args.prune_startup_trials))
  sampler = optuna.samplers.TPESampler(seed=args.sampler_seed)
  settings = settings_of(args)
  with StudyLock(sweep_dir(study_path) / ".lock"):
    study, storage = open_study(optuna, study_path, settings, pruner, sampler)
    queued = requeue_stopped(optuna, study, storage)
    if queued:
      print(f"trial(s) {', '.join(map(str, queued))} were stopped unfinished: queued again",
            flush=True)
    left = args.trials - sum(counted(t) for t in study.get_trials(deepcopy=False))
    git = bl.git_state()
    print(f"sweep {study_path}: {settings['row']} {settings['mode']}, seeds "
          f"{bl.format_seeds(settings['seeds'])}, {left} trial(s) to run of {args.trials} "
          f"(git {git['commit']}{', modified' if git['dirty'] else ''})", flush=True)
    if left <= 0:
      return False
    objective = make_objective(optuna, settings, args.params, sweep_dir(study_path),
                               args.timeout, git)
    try:
      study.optimize(objective, n_trials=left, timeout=args.max_time, catch=(RunFailed,))
    except KeyboardInterrupt:
      print("\ninterrupted; its run was stopped. Rerun the same command to continue.", flush=True)
      return True
  return False


def main(argv: Sequence[str] | None = None) -> int:
  args = parse_args(argv)
  optuna = require_optuna()
  # Our own line per run instead; Optuna's warning for a failed trial repeats it with a traceback.
  optuna.logging.set_verbosity(optuna.logging.ERROR)
  study_path = Path(args.study).resolve()  # the runs' --logdir too, and they run in ROOT
  # Runs are in sessions of their own (bench_learning.execute), so a SIGTERM or SIGHUP that ends
  # this process would leave the run going: take them as Ctrl-C, which stops it.
  previous = {}
  if threading.current_thread() is threading.main_thread():
    for sig in (signal.SIGTERM, signal.SIGHUP):
      previous[sig] = signal.signal(sig, signal.default_int_handler)
  try:
    interrupted = False if args.report else run_sweep(optuna, args, study_path)
    study, _ = open_study(optuna, study_path, None)
  except SweepError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  finally:
    for sig, handler in previous.items():
      signal.signal(sig, handler)
  print("\n" + report(optuna, study, study_path))
  out = sweep_dir(study_path)
  print(f"table: {out / 'trials.md'}" + (f", best: {out / 'best.json'}"
                                         if (out / "best.json").exists() else ""))
  return 130 if interrupted else 0


if __name__ == "__main__":
  sys.exit(main())
