"""Where each MinAtar preset's time goes: its env steps/s against the env-only ceiling.

For every --algos preset (`experiments/<algo>.py --preset minatar`: DQN and Rainbow from
Revisiting Rainbow, PPO from gymnax-blines, IMPALA, PQN from purejaxql), one run of
--duration seconds on --env-id, each as its own subprocess in the preset's default
arrangement (one process actor on this machine, as `bench_learning.py` runs them), no
evaluations. From the run's TensorBoard records (one every --record-seconds or so, the
interval derived per preset from a first guess of its pace), the steady rates: env steps/s and
SGD steps/s over the records after --warmup seconds (jit compilation and the actor's start-up
excluded). From its summary.json: the learner thread's time fractions (update, wait for data,
ingest, publish), the fraction of time the actor was blocked on a full queue, the policy lag
and the run's own bottleneck verdict (`jaxasync.bottleneck`).

And the env alone: the same MinAtar vector env (`MinAtarEnvFactory`, the preset's number of
sub-envs) stepped with uniformly random actions in this process for --env-duration seconds,
after the runs (so they do not share the cores): the pace one actor core could reach if acting
and pushing chunks cost nothing. "of ceiling" = the preset's env steps/s / that.

SGD steps: DQN, Rainbow and IMPALA count one SGD step per opt step; PPO and PQN run epochs x
minibatches SGD steps per opt step (one iteration on one batch of unrolls), so their opt steps/s
are multiplied by that.

Run (from the repository root; about 2 min per preset at the default duration):
  python scripts/bench_minatar.py                                   # every preset, Breakout
  python scripts/bench_minatar.py --algos ppo pqn --duration 60 --env-id MinAtar/Asterix-v1
  python scripts/bench_minatar.py --json /tmp/minatar_throughput.json
  python scripts/bench_minatar.py --algos ppo pqn --extra="--no-pin-cpus"  # a setting tried on each
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
import time
from pathlib import Path
from typing import Literal

import numpy as np
import tyro

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from jaxasync.minatar import MinAtarEnvFactory  # noqa: E402
from jaxasync.plot import read_scalars  # noqa: E402

Algo = Literal["dqn", "rainbow", "ppo", "impala", "pqn"]
ALGOS: tuple[Algo, ...] = ("dqn", "rainbow", "ppo", "impala", "pqn")

# Env steps one opt step pays for, roughly, on this machine (a first guess of each preset's
# pace), only to place about one record every --record-seconds: DQN and Rainbow insert 4
# transitions per vector step and train 1 SGD step per 4 (updates_per_call 4); PPO's iteration
# is 64 envs x 128 steps, IMPALA's 32 x 20, PQN's 128 x 32.
ENV_STEPS_PER_OPT = {"dqn": 1, "rainbow": 1, "ppo": 8192, "impala": 640, "pqn": 4096}
GUESS_ENV_STEPS_PER_S = {"dqn": 400, "rainbow": 400, "ppo": 2000, "impala": 4000, "pqn": 1000}


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
  """flags appended to every run's command, as one string (write the '=': --extra="--no-pin-cpus"),
  as in bench_learning.py."""
  logdir: str | None = None
  """where the runs write (default: a temporary directory, removed at the end)."""
  json: str | None = None
  """write the figures here as JSON."""


def steady_rate(rows: list[tuple[int, float, float]], warmup: float) -> float | None:
  """Slope of a counter's ``(step, wall_time, value)`` records over wall time, from the first
  record at least ``warmup`` seconds after the first one to the last; None with fewer than two
  such records."""
  if not rows:
    return None
  start = rows[0][1] + warmup
  window = [(t, v) for _, t, v in rows if t >= start]
  if len(window) < 2 or window[-1][0] <= window[0][0]:
    return None
  (t0, v0), (t1, v1) = window[0], window[-1]
  return (v1 - v0) / (t1 - t0)


def sgd_steps_per_opt(settings: dict) -> int:
  """SGD steps in one opt step, from a run's config.json ``settings``: epochs x minibatches for
  PPO and PQN (their ``agent.num_epochs`` and ``agent.num_minibatches``), 1 for the others."""
  return (int(settings.get("agent.num_epochs", 1))
          * int(settings.get("agent.num_minibatches", 1)))


def kill_group(proc: subprocess.Popen) -> None:
  """SIGTERM to the run's process group (its process actor included), SIGKILL if it lingers."""
  for sig in (signal.SIGTERM, signal.SIGKILL):
    try:
      os.killpg(proc.pid, sig)
    except ProcessLookupError:
      return
    try:
      proc.wait(10)
      return
    except subprocess.TimeoutExpired:
      pass


def run_preset(algo: Algo, args: Args, logdir: Path) -> dict:
  """One --duration run of ``algo``'s MinAtar preset; its steady rates and time fractions."""
  record_interval = max(1, round(args.record_seconds * GUESS_ENV_STEPS_PER_S[algo]
                                 / ENV_STEPS_PER_OPT[algo]))
  command = [sys.executable, f"experiments/{algo}.py", "--preset", "minatar",
             "--env-id", args.env_id, "--seed", str(args.seed), "--duration", str(args.duration),
             "--eval-interval", "0", "--eval-episodes", "1", "--record-interval", str(record_interval),
             "--logdir", str(logdir), "--no-progress", *shlex.split(args.extra)]
  logdir.mkdir(parents=True, exist_ok=True)
  with open(logdir / "log.txt", "w") as log:
    proc = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
      returncode = proc.wait(args.duration + 600)
    except BaseException:  # a timeout or Ctrl-C: stop the run and its actor
      kill_group(proc)
      raise
  summary_path = logdir / "summary.json"
  if returncode != 0 or not summary_path.exists():
    tail = (logdir / "log.txt").read_text()[-2000:]
    raise RuntimeError(f"{algo}: the run exited {returncode} without a summary; its log ends:\n"
                       f"{tail}")
  summary = json.loads(summary_path.read_text())
  config = json.loads((logdir / "config.json").read_text())
  scalars = read_scalars(logdir)
  env_rate = steady_rate(scalars.get("env_steps", []), args.warmup)
  opt_rate = steady_rate(scalars.get("opt_steps", []), args.warmup)
  per_opt = sgd_steps_per_opt(config["settings"])
  actors = summary.get("actors") or []
  return {
      "algo": algo, "command": " ".join(command[1:]), "mode": summary.get("mode"),
      "num_envs": config["settings"]["actors.num_envs"],
      "num_actors": len(actors),
      "env_steps_per_sec": env_rate, "opt_steps_per_sec": opt_rate,
      "sgd_steps_per_opt": per_opt,
      "sgd_steps_per_sec": None if opt_rate is None else opt_rate * per_opt,
      "stage_fractions": summary.get("stage_fractions", {}),
      "actors_blocked_fraction": summary.get("actors_blocked_fraction"),
      "policy_lag_mean": summary.get("policy_lag_mean"),
      "bottleneck": summary.get("bottleneck"),
      "summary_env_steps": summary.get("env_steps"), "summary_wall_s": summary.get("wall_s"),
  }


def env_ceiling(env_id: str, num_envs: int, duration: float, seed: int) -> float:
  """Env steps/s of the MinAtar vector env alone (random actions, this process, one core)."""
  env = MinAtarEnvFactory(env_id)(num_envs, seed=seed)
  rng = np.random.default_rng(seed)
  n_actions = env.single_action_space.n
  try:
    end_warmup = time.perf_counter() + min(1.0, duration / 5)
    while time.perf_counter() < end_warmup:
      env.step(rng.integers(0, n_actions, size=num_envs))
    steps, start = 0, time.perf_counter()
    while (now := time.perf_counter()) - start < duration:
      env.step(rng.integers(0, n_actions, size=num_envs))
      steps += num_envs
  finally:
    env.close()
  return steps / (now - start)


def fmt(x: float | None, spec: str = ",.0f") -> str:
  return "-" if x is None else format(x, spec)


def main(args: Args) -> dict:
  with tempfile.TemporaryDirectory() as tmp:
    base = Path(args.logdir or tmp)
    rows = [run_preset(algo, args, base / algo) for algo in args.algos]
  ceilings = {n: env_ceiling(args.env_id, n, args.env_duration, args.seed)
              for n in sorted({r["num_envs"] for r in rows})}
  for r in rows:
    r["env_ceiling_per_sec"] = ceilings[r["num_envs"]]
    r["of_ceiling"] = (None if r["env_steps_per_sec"] is None
                       else r["env_steps_per_sec"] / r["env_ceiling_per_sec"])
  print(f"{args.env_id}, {os.cpu_count()} cores, {args.duration:.0f} s per preset, rates after "
        f"{args.warmup:.0f} s")
  print("| preset | arrangement | env steps/s | env alone (same sub-envs) | of ceiling | SGD steps/s "
        "| learner: update / wait / ingest / publish | actor blocked | policy lag | bottleneck |")
  print("|---|---|---|---|---|---|---|---|---|---|")
  for r in rows:
    f = r["stage_fractions"]
    stages = " / ".join(fmt(f.get(k), ".2f") for k in ("update", "wait", "ingest", "publish"))
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
