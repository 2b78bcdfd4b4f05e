"""Where each MinAtar preset's time goes: its env steps/s against the env-only ceiling.

For every --algos preset (`experiments/<algo>.py --preset minatar`: DQN and Rainbow from
Revisiting Rainbow, PPO from gymnax-blines, IMPALA, PQN from purejaxql), one run of
--duration seconds on --env-id, each as its own subprocess in the preset's default
arrangement (one process actor on this machine, as `bench_learning.py` runs them), no
evaluations. Everything is read from the run's TensorBoard records (about one every
--record-seconds) over a window: from the first record at least --warmup seconds after the
first one (jit compilation and the actor's start-up excluded) to the last.
  env steps/s, SGD steps/s   the counters' slopes over the window.
  learner's time fractions   ingest, sample, update, publish, wait for data: the learner
                             thread's seconds in each stage over the window. The records
                             hold each stage's share of the run so far, so the seconds are
                             recovered with the run's clock (summary.json's wall_s, aligned on
                             the time summary.json was written); an error of d seconds there
                             moves a fraction by only (change of that share over the window) x
                             d / window.
  policy lag                 the mean of the records' policy_lag_mean over the window.
From summary.json: the actor's blocked fraction (from the first record on) and the run's
bottleneck verdict (`jaxasync.bottleneck`, from the first record on).

And the env alone: the same MinAtar vector env (`MinAtarEnvFactory`, the preset's number of
sub-envs) stepped with uniformly random actions in this process for --env-duration seconds,
after the runs (so they do not share the cores): the pace one actor core could reach if acting
and pushing chunks cost nothing. "of ceiling" = the preset's env steps/s / that.

SGD steps: DQN, Rainbow and IMPALA count one SGD step per opt step; PPO and PQN run epochs x
minibatches SGD steps per opt step (one iteration on one batch of unrolls), so their opt steps/s
are multiplied by that. A run that fails or times out is reported as failed, with its log's
tail, and the others go on.

Run (from the repository root; about 2 min per preset at the default duration; --logdir must
not hold earlier runs):
  python scripts/bench_minatar.py                                   # every preset, Breakout
  python scripts/bench_minatar.py --algos ppo pqn --duration 60 --env-id MinAtar/Asterix-v1
  python scripts/bench_minatar.py --json /tmp/minatar_throughput.json
  python scripts/bench_minatar.py --algos ppo pqn --extra="--pin-cpus False"  # tried on each
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Callable, Literal

import numpy as np
import tyro

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from jaxasync.minatar import MinAtarEnvFactory  # noqa: E402
from jaxasync.plot import read_scalars  # noqa: E402

sys.path.insert(0, str(ROOT / "scripts"))
from bench_atari import measure as measure_env  # noqa: E402
from bench_learning import kill_group  # noqa: E402

Algo = Literal["dqn", "rainbow", "ppo", "impala", "pqn"]
ALGOS: tuple[Algo, ...] = ("dqn", "rainbow", "ppo", "impala", "pqn")

# Opt steps per second of each preset, roughly, on a 2-core machine (measured once), only to
# place about one record every --record-seconds: DQN and Rainbow count SGD steps (one per 4 env
# steps); PPO, IMPALA and PQN one iteration per batch of unrolls.
GUESS_OPT_STEPS_PER_S = {"dqn": 370.0, "rainbow": 220.0, "ppo": 1.5, "impala": 40.0, "pqn": 0.8}
STAGES = ("update", "sample", "wait", "ingest", "publish")


@dataclasses.dataclass
class Args:
  algos: tuple[Algo, ...] = ALGOS
  env_id: str = "MinAtar/Breakout-v1"
  duration: float = 90.0
  """each run's --duration (wall seconds of training, start-up excluded)."""
  warmup: float = 20.0
  """seconds of records, from the first one, left out of the steady rates."""
  record_seconds: float = 3.0
  """about how often each run records its counters."""
  env_duration: float = 10.0
  """seconds the env alone is stepped, per distinct number of sub-envs."""
  seed: int = 0
  extra: str = ""
  """flags appended to every run's command, as one string (write the '=':
  --extra="--pin-cpus False"), as in bench_learning.py."""
  logdir: str | None = None
  """where the runs write (default: a temporary directory, removed at the end)."""
  json: str | None = None
  """write the figures here as JSON."""


def steady_rate(rows: list[tuple[int, float, float]], warmup: float) -> float | None:
  """Slope of a counter's ``(step, wall_time, value)`` records over wall time, from the first
  record at least ``warmup`` seconds after the first one to the last; None with fewer than two
  such records."""
  w = window(rows, warmup)
  if len(w) < 2 or w[-1][0] <= w[0][0]:
    return None
  (t0, v0), (t1, v1) = w[0], w[-1]
  return (v1 - v0) / (t1 - t0)


def window(rows: list[tuple[int, float, float]], warmup: float) -> list[tuple[float, float]]:
  """The ``(wall_time, value)`` of the records at least ``warmup`` seconds after the first."""
  if not rows:
    return []
  return [(t, v) for _, t, v in rows if t >= rows[0][1] + warmup]


def window_fraction(rows: list[tuple[int, float, float]], warmup: float,
                    elapsed: Callable[[float], float]) -> float | None:
  """A stage's share of the window's wall time, from records of its share of the run so far
  (``time_<stage>_frac``) and ``elapsed(wall_time)``, the run's seconds at a record: the slope
  of the stage's seconds so far (share x elapsed)."""
  return steady_rate([(step, t, f * elapsed(t)) for step, t, f in rows], warmup)


def sgd_steps_per_opt(algo: Algo, settings: dict) -> int:
  """SGD steps in one opt step, from a run's config.json ``settings``: epochs x minibatches for
  PPO and PQN (``agent.num_epochs``, ``agent.num_minibatches``: a KeyError if they are
  renamed, rather than a rate 32-64x too low), 1 for the others."""
  if algo in ("ppo", "pqn"):
    return int(settings["agent.num_epochs"]) * int(settings["agent.num_minibatches"])
  return 1


def run_preset(algo: Algo, args: Args, logdir: Path) -> dict:
  """One --duration run of ``algo``'s MinAtar preset: its steady rates and time fractions, or
  ``failed`` with the tail of its log."""
  record_interval = max(1, round(args.record_seconds * GUESS_OPT_STEPS_PER_S[algo]))
  command = [sys.executable, f"experiments/{algo}.py", "--preset", "minatar",
             "--env-id", args.env_id, "--seed", str(args.seed), "--duration", str(args.duration),
             "--eval-interval", "0", "--eval-episodes", "1", "--record-interval", str(record_interval),
             "--logdir", str(logdir), "--no-progress", *shlex.split(args.extra)]
  row = {"algo": algo, "command": shlex.join(command[1:]), "failed": True}
  logdir.mkdir(parents=True, exist_ok=True)
  with open(logdir / "log.txt", "w") as log:
    # A session of its own, so that killpg reaches its actor (bench_learning's kill_group).
    proc = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
      returncode = proc.wait(args.duration + 600)
    except subprocess.TimeoutExpired:
      kill_group(proc)
      returncode = "timed out"
    except BaseException:  # Ctrl-C (or SIGTERM, see main): stop the run and its actor
      kill_group(proc)
      raise
  summary_path = logdir / "summary.json"
  if returncode != 0 or not summary_path.exists():
    return row | {"error": f"exited {returncode}; log: "
                           + (logdir / "log.txt").read_text()[-1500:]}
  summary = json.loads(summary_path.read_text())
  settings = json.loads((logdir / "config.json").read_text())["settings"]
  scalars = read_scalars(logdir)
  # The run's clock at a record: its trainer seconds at the end, counted back from the time
  # summary.json was written (wall_time and mtime are both time.time()).
  end = summary_path.stat().st_mtime
  elapsed = lambda t: summary["wall_s"] - (end - t)  # noqa: E731
  opt_rate = steady_rate(scalars.get("opt_steps", []), args.warmup)
  per_opt = sgd_steps_per_opt(algo, settings)
  lags = [v for _, v in window(scalars.get("policy_lag_mean", []), args.warmup)]
  return row | {
      "failed": False, "mode": summary.get("mode"), "num_envs": settings["actors.num_envs"],
      "num_actors": len(summary.get("actors") or []),
      "env_steps_per_sec": steady_rate(scalars.get("env_steps", []), args.warmup),
      "opt_steps_per_sec": opt_rate, "sgd_steps_per_opt": per_opt,
      "sgd_steps_per_sec": None if opt_rate is None else opt_rate * per_opt,
      "stage_fractions": {k: window_fraction(scalars.get(f"time_{k}_frac", []), args.warmup,
                                             elapsed) for k in STAGES},
      "actors_blocked_fraction": summary.get("actors_blocked_fraction"),
      "policy_lag_mean": sum(lags) / len(lags) if lags else None,
      "bottleneck": summary.get("bottleneck"),
      "summary_env_steps": summary.get("env_steps"), "summary_wall_s": summary.get("wall_s"),
  }


def env_ceiling(env_id: str, num_envs: int, duration: float, seed: int) -> float:
  """Env steps/s of the MinAtar vector env alone (random actions, this process, one core):
  bench_atari.py's measurement, on MinAtar's env."""
  env = MinAtarEnvFactory(env_id)(num_envs, seed=seed)
  try:
    return measure_env(env, duration, min(1.0, duration / 5), np.random.default_rng(seed))
  finally:
    env.close()


def fmt(x: float | None, spec: str = ",.0f") -> str:
  return "-" if x is None else format(x, spec)


def main(args: Args) -> dict:
  if not 0 <= args.warmup < args.duration or args.env_duration <= 0 or args.record_seconds <= 0:
    raise SystemExit(f"error: need 0 <= --warmup < --duration and --env-duration, "
                     f"--record-seconds > 0; got {args.warmup}, {args.duration}, "
                     f"{args.env_duration}, {args.record_seconds}.")
  # Runs are in sessions of their own, so a SIGTERM or SIGHUP that ended this process would
  # leave the run going: take them as Ctrl-C, which stops it (as bench_learning.py does).
  previous = {}
  if threading.current_thread() is threading.main_thread():
    for sig in (signal.SIGTERM, signal.SIGHUP):
      previous[sig] = signal.signal(sig, signal.default_int_handler)
  try:
    with tempfile.TemporaryDirectory() as tmp:
      base = Path(args.logdir or tmp)
      rows = [run_preset(algo, args, base / algo) for algo in args.algos]
  finally:
    for sig, handler in previous.items():
      signal.signal(sig, handler)
  done = [r for r in rows if not r["failed"]]
  ceilings = {n: env_ceiling(args.env_id, n, args.env_duration, args.seed)
              for n in sorted({r["num_envs"] for r in done})}
  for r in done:
    r["env_ceiling_per_sec"] = ceilings[r["num_envs"]]
    r["of_ceiling"] = (None if r["env_steps_per_sec"] is None
                       else r["env_steps_per_sec"] / r["env_ceiling_per_sec"])
  print(f"{args.env_id}, {os.cpu_count()} cores, {args.duration:.0f} s per preset, rates and "
        f"fractions after {args.warmup:.0f} s")
  print("| preset | arrangement | env steps/s | env alone (same sub-envs) | of ceiling | SGD steps/s "
        "| learner: update / sample / wait / ingest / publish | actor blocked | policy lag "
        "| bottleneck |")
  print("|---|---|---|---|---|---|---|---|---|---|")
  for r in rows:
    if r["failed"]:
      print(f"| {r['algo']} | failed: {r['command']} | | | | | | | | |\n{r['error']}")
      continue
    f = r["stage_fractions"]
    stages = " / ".join(fmt(f[k], ".2f") for k in STAGES)
    print(f"| {r['algo']} | {r['mode']}, {r['num_actors']} actor x {r['num_envs']} envs "
          f"| {fmt(r['env_steps_per_sec'])} | {fmt(r['env_ceiling_per_sec'])} "
          f"| {fmt(r['of_ceiling'], '.2f')} | {fmt(r['sgd_steps_per_sec'], ',.1f')} "
          f"| {stages} | {fmt(r['actors_blocked_fraction'], '.2f')} "
          f"| {fmt(r['policy_lag_mean'], '.1f')} | {r['bottleneck']} |")
  result = {"config": dataclasses.asdict(args) | {"cpu_count": os.cpu_count()},
            "env_ceiling_per_sec": {str(n): v for n, v in ceilings.items()}, "presets": rows}
  if args.json:
    Path(args.json).write_text(json.dumps(result, indent=2))
  return result


if __name__ == "__main__":
  main(tyro.cli(Args))
