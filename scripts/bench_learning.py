"""Multi-seed learning dashboard: how reliably, how fast and how stably each algorithm learns, per mode.

A throughput figure says nothing about whether the agent learns; one seed says little about how
often it does. This script runs a matrix of (row x mode x seed), one experiment at a time, each
as its own subprocess (`experiments/<script>.py --seed S --logdir <out>/runs/<row>/<mode>/seed<S>
--no-progress` plus the row's, the mode's and --extra's flags), reads the `evals` of every
run's summary.json and tabulates them per cell (row x mode) and per run.

Rows (ROWS below; add one per algorithm and env):
  dqn-cartpole               experiments/dqn.py                                    target 475, hold 450
  dqn-acrobot                experiments/dqn.py --env-id Acrobot-v1                target -100, hold -100
  rainbow-cartpole           experiments/rainbow.py (preset cartpole)              target 475, hold 450
  sac-pendulum               experiments/sac.py (Pendulum-v1, 20k env steps)       target -200, hold -170
  td3-pendulum               experiments/td3.py (Pendulum-v1, 20k env steps)       target -200, hold -170
  impala-cartpole            experiments/impala.py (300k env steps)                target 475, hold 450
  ppo-cartpole               experiments/ppo.py (150k env steps)                   target 475, hold 450
  pqn-cartpole               experiments/pqn.py (500k env steps)                   target 475, hold 450
  impala-acrobot             experiments/impala.py --env-id Acrobot-v1, 500k env steps  target -100,
                             hold -100; only when named in --rows.
  ppo-acrobot                experiments/ppo.py --env-id Acrobot-v1, 500k env steps  target -100,
                             hold -100; only when named in --rows.
  dqn-cartpole-2dev          experiments/dqn.py --learner-devices 2, XLA_FLAGS splitting the CPU
                             in 2 devices; target 475, hold 450; only when named in --rows.
  rainbow-minatar-breakout   experiments/rainbow.py --preset minatar --duration 600  report only;
                             not run unless named in --rows (10 min a run).
  {sac,td3,ppo}-{halfcheetah,hopper,walker2d}
                             the --preset mujoco runs (SAC/TD3 300k env steps, PPO 1M); target
                             the published mean at that budget (MUJOCO_PUBLISHED), hold 0.8 of
                             it; only when named in --rows.
  {ppo,impala,pqn,dqn}-minatar-{breakout,spaceinvaders,asterix,freeway,seaquest}
                             the --preset minatar runs (PPO, IMPALA and PQN 5M env steps, DQN
                             2M); target issue 32's bar (MINATAR_TARGETS; IMPALA and PQN take
                             PPO's), hold 0.8 of it; only when named.
Modes: sync (--mode sync), thread (--mode thread), process (--mode process), ray (--mode ray: a
local Ray instance; only when named in --modes).

Each run's stdout and stderr go to <logdir>/log.txt. A run that exits non-zero or runs past
its timeout (--timeout seconds, or its row's: 900, 2-4 hours for the MuJoCo and MinAtar rows;
its whole process group is killed: process actors too) is recorded as failed,
with the tail of its log, and the matrix goes on. <logdir>/bench_run.json records the run's
command, exit status and git commit. --resume skips runs whose summary.json exists, unless
bench_run.json says the run failed or the summary says it was interrupted; a run about to start
has its old summary.json removed first, so a leftover is never taken for a result.

Per run, from the evaluations (each one a mean return over --eval-episodes, every --eval-interval
opt steps):
  best          the highest evaluation.
  final         the last evaluation.
  last-5 mean   the mean of the last 5 evaluations (of all of them when there are fewer).
  env steps / wall s to target
                env steps and trainer seconds (the summary's clock: from the trainer's start,
                Python and JAX imports excluded, compilation and process actors' start-up
                included) at the first evaluation >= the row's target; '-' when none did.
                Runs keep their compiled programs (--compile-cache, on by default), so the
                first run of a row on a machine compiles them and the later ones load them;
                --extra="--compile-cache None" compiles in every run.
  AUC           the area under the eval-return curve over env steps (trapezoids between
                evaluations) divided by the env-step span from the first to the last evaluation:
                the curve's mean return, in return units, so runs of different lengths compare.
  solved        best >= target.
  held          final >= the row's hold threshold AND last-5 mean >= it (it learnt and stayed).
  stability     among the evaluations strictly after the first one >= the row's target, the
                fraction >= the row's hold threshold (how often it swung back down once learnt);
                1.00 when that first one is the last evaluation; '-' (null in results.json)
                when no evaluation reached the target.
  totals        env steps, opt steps and trainer seconds of the whole run (summary.json).
Per cell: solved and held as k/n over the n seeds run (a failed run counts as neither); returns
and AUC as "median / worst" (worst = min) over the runs that did not fail; env steps and wall s to
target as "median / worst" with worst = max and a seed that never reached the target (or failed)
counted as infinitely slow, so the median is '-' once half the seeds never got there; stability
as "median / worst" (worst = min) over the runs that reached the target, and stable = k/n, the
seeds with stability >= 0.95; IQM final and IQM AUC: the interquartile mean over the seeds that
did not fail (rliable's: sorted, int(n/4) cut from each end, the rest averaged, i.e.
scipy.stats.trim_mean(x, 0.25)) of the final evaluation and of the AUC, each with a 95%
percentile-bootstrap interval (2000 resamplings of the seeds with replacement, a fixed random
seed, so the same runs give the same table), shown as "498.2 [471.0, 500.0]".

Outputs in --out: results.json (every run's figures and exact command, the per-cell aggregates,
the git commit and whether tracked files were modified), results.md (the two tables, also printed
at the end), and one <row>-<mode>.png per cell: eval return against env steps, one thin line per
seed, their median in bold and range shaded (jaxasync.plot: each seed interpolated onto a
common env-step grid, over the range every seed covers), the worst seed (lowest final evaluation,
ties broken by the lowest last-5 mean) highlighted and labelled with its seed when there are
several, the target dashed. PNGs need matplotlib (pip install matplotlib).

Seeds: --seeds takes integers and inclusive ranges, in any mixture: --seeds 0 1 2, --seeds 0-19,
--seeds 0-4 10 12-13 (a seed may be named once).

Run (from the repository root; the full default matrix is 8 rows x 3 modes x 5 seeds = 120 runs):
  python scripts/bench_learning.py                                    # the full matrix
  python scripts/bench_learning.py --resume                           # continue an interrupted one
  python scripts/bench_learning.py --rows dqn-cartpole --modes sync --seeds 0 1   # a quick check
  python scripts/bench_learning.py --rows dqn-cartpole --modes sync --seeds 0-19  # 20 seeds: IQM
  python scripts/bench_learning.py --rows rainbow-minatar-breakout --modes process --seeds 0-2
  python scripts/bench_learning.py --rows dqn-cartpole --out /tmp/lr5e-4 \\
      --extra "--agent.learning-rate 5e-4 --max-opts 20000"         # a setting across the matrix
  python scripts/bench_learning.py --dry-run                          # print the commands only
--extra's value is split like a shell command line and appended to every run's flags, so it
overrides the row's and the mode's. A single flag without a space must be given with '=':
--extra=--no-dueling (argparse takes a lone value starting with '-' for an option). A subcommand
(a loss: --extra "agent.loss:q-learning --agent.loss.num-q-networks 2") comes after every other
flag of the run, so --extra, which comes last, is where it goes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import re
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from jaxasync.plot import draw_curves

ROOT = Path(__file__).resolve().parents[1]
LOG_TAIL_LINES = 30
LAST_K = 5  # evaluations averaged into "last-5 mean"
STABLE = 0.95  # a run with stability >= this counts as "stable" in its cell
BOOTSTRAP_RESAMPLES = 2000  # resamples of the seeds behind each IQM's 95% interval
BOOTSTRAP_SEED = 0  # fixed, so that the same runs give the same table


@dataclasses.dataclass(frozen=True)
class Row:
  """One algorithm on one env: the script, its flags, and what counts as learnt."""
  script: str
  """path from the repository root."""
  flags: tuple[str, ...] = ()
  target: float | None = None
  """'solved' and the to-target columns; None: report only."""
  hold: float | None = None
  """'held': final and last-5 mean both >= this; None: report only."""
  default: bool = True
  """in --rows' default selection."""
  env: tuple[tuple[str, str], ...] = ()
  """environment variables the run needs (set before its JAX starts)."""
  timeout: float = 900.0
  """seconds a run may take before it is killed and recorded as failed (--timeout overrides):
  the long rows' own budgets with room for a loaded machine."""


MUJOCO_ENVS = ("HalfCheetah", "Hopper", "Walker2d")
MINATAR_GAMES = ("Breakout", "SpaceInvaders", "Asterix", "Freeway", "Seaquest")
# Issue 32's bars, each row's target (held: 0.8 of it). DQN: the MinAtar paper's DQN (replay
# and target network) at 5M frames, read from its learning curves (Young & Tian 2019, Fig. 2;
# training returns, 30 seeds). PPO: 0.8 of gymnax-blines' PPO at 10M steps (gymnax README's
# checkpoint returns: Breakout 28, SpaceInvaders 131, Asterix 15, Freeway 58); Seaquest, which
# gymnax-blines does not report, the paper's DQN figure.
MINATAR_TARGETS = {
    ("dqn", "Breakout"): 10.0, ("dqn", "SpaceInvaders"): 43.0, ("dqn", "Asterix"): 17.0,
    ("dqn", "Freeway"): 50.0, ("dqn", "Seaquest"): 20.0,
    ("ppo", "Breakout"): 0.8 * 28, ("ppo", "SpaceInvaders"): 0.8 * 131,
    ("ppo", "Asterix"): 0.8 * 15, ("ppo", "Freeway"): 0.8 * 58, ("ppo", "Seaquest"): 20.0,
}
# Published means over seeds at the rows' budgets (read by a session on 2026-11-26):
# SAC at 300k env steps: Tianshou's SAC, -v3 envs, 10 seeds, deterministic test returns
# (their docs' per-evaluation curves, docs/_static/js/mujoco/benchmark/<Env>-v3/result.json);
# TD3 at 300k: the TD3 authors' curves (github.com/sfujim/TD3 learning_curves, -v1, 10
# seeds, 10 deterministic episodes per evaluation); PPO at 1M: CleanRL's
# ppo_continuous_action (-v4, 3 seeds, training episode returns; docs/rl-algorithms/ppo.md).
MUJOCO_PUBLISHED = {
    ("sac", "HalfCheetah"): 9059.0, ("sac", "Hopper"): 3388.0, ("sac", "Walker2d"): 3387.0,
    ("td3", "HalfCheetah"): 7697.0, ("td3", "Hopper"): 2410.0, ("td3", "Walker2d"): 3336.0,
    ("ppo", "HalfCheetah"): 2906.0, ("ppo", "Hopper"): 2052.0, ("ppo", "Walker2d"): 2891.0,
}
ROWS: dict[str, Row] = {
    "dqn-cartpole": Row("experiments/dqn.py", (), target=475.0, hold=450.0),
    "dqn-acrobot": Row("experiments/dqn.py", ("--env-id", "Acrobot-v1"), target=-100.0,
                       hold=-100.0),
    "rainbow-cartpole": Row("experiments/rainbow.py", (), target=475.0, hold=450.0),
    "sac-pendulum": Row("experiments/sac.py", (), target=-200.0, hold=-170.0),
    "td3-pendulum": Row("experiments/td3.py", (), target=-200.0, hold=-170.0),
    "impala-cartpole": Row("experiments/impala.py", (), target=475.0, hold=450.0),
    "ppo-cartpole": Row("experiments/ppo.py", (), target=475.0, hold=450.0),
    "pqn-cartpole": Row("experiments/pqn.py", (), target=475.0, hold=450.0),
    # The CartPole presets carried to another env (issue 28: defaults must carry beyond the
    # env they were tuned on); CleanRL's PPO reaches about -86 on Acrobot at 500k env steps.
    "impala-acrobot": Row("experiments/impala.py",
                          ("--env-id", "Acrobot-v1", "--max-env-steps", "500000"),
                          target=-100.0, hold=-100.0, default=False),
    "ppo-acrobot": Row("experiments/ppo.py", ("--env-id", "Acrobot-v1", "--max-env-steps", "500000"),
                       target=-100.0, hold=-100.0, default=False),
    # The learner's update split over 2 devices (the CPU split in two): learns as dqn-cartpole.
    "dqn-cartpole-2dev": Row("experiments/dqn.py", ("--learner-devices", "2"), target=475.0,
                             hold=450.0, default=False,
                             env=(("XLA_FLAGS", "--xla_force_host_platform_device_count=2"),)),
    # MuJoCo (pip install "gymnasium[mujoco]"), only when asked for: issue 31's budgets, SAC
    # and TD3 300k env steps (35-60 min a run here, one SGD step per env step), PPO 1M.
    # Target: the published mean at that budget (MUJOCO_PUBLISHED); held: 0.8 of it.
    **{f"{algo}-{env.lower()}": Row(f"experiments/{algo}.py",
                                    ("--preset", "mujoco", "--env-id", f"{env}-v5",
                                     "--max-env-steps", str(steps), "--max-opts", str(steps)),
                                    target=MUJOCO_PUBLISHED[algo, env],
                                    hold=0.8 * MUJOCO_PUBLISHED[algo, env], default=False,
                                    timeout=4 * 3600.0)
       for algo, steps in (("sac", 300_000), ("td3", 300_000)) for env in MUJOCO_ENVS},
    **{f"ppo-{env.lower()}": Row("experiments/ppo.py",
                                 ("--preset", "mujoco", "--env-id", f"{env}-v5"),
                                 target=MUJOCO_PUBLISHED["ppo", env],
                                 hold=0.8 * MUJOCO_PUBLISHED["ppo", env], default=False,
                                 timeout=2 * 3600.0)
       for env in MUJOCO_ENVS},
    # MinAtar, only when asked for, at issue 32's 2-core budgets: PPO (gymnax-blines' preset),
    # IMPALA and PQN (purejaxql's preset) 5M env steps (gymnax-blines and purejaxql run 10M),
    # DQN (Revisiting Rainbow's) 2M (500k SGD steps); targets MINATAR_TARGETS, IMPALA and PQN
    # PPO's (issue 32 sets PPO's or PQN's bar; we found no published IMPALA MinAtar results).
    **{f"{algo}-minatar-{game.lower()}": Row(f"experiments/{algo}.py",
                                             ("--preset", "minatar", "--env-id",
                                              f"MinAtar/{game}-v1", "--max-env-steps", "5000000"),
                                             target=MINATAR_TARGETS["ppo", game],
                                             hold=0.8 * MINATAR_TARGETS["ppo", game],
                                             default=False, timeout=2 * 3600.0)
       for algo in ("ppo", "impala", "pqn") for game in MINATAR_GAMES},
    **{f"dqn-minatar-{game.lower()}": Row("experiments/dqn.py",
                                          ("--preset", "minatar", "--env-id",
                                           f"MinAtar/{game}-v1", "--max-env-steps", "2000000"),
                                          target=MINATAR_TARGETS["dqn", game],
                                          hold=0.8 * MINATAR_TARGETS["dqn", game],
                                          default=False, timeout=4 * 3600.0)
       for game in MINATAR_GAMES},
    # 10 minutes a run: only when asked for.
    "rainbow-minatar-breakout": Row("experiments/rainbow.py",
                                    ("--preset", "minatar", "--duration", "600"), default=False),
}

MODES: dict[str, tuple[str, ...]] = {
    "sync": ("--mode", "sync"),
    "thread": ("--mode", "thread"),
    "process": ("--mode", "process"),
    "ray": ("--mode", "ray"),  # (pip install -e ".[ray]")
}


# --- figures (pure) -------------------------------------------------------------------------------
def trapezoid_mean(xs: Sequence[float], ys: Sequence[float]) -> float | None:
  """Trapezoid area under (xs, ys) divided by the span xs[-1] - xs[0]: the curve's mean height.

  A single point (or a zero span) is its own mean; no points: None.
  """
  if not xs:
    return None
  span = xs[-1] - xs[0]
  if span <= 0:
    return float(statistics.fmean(ys))
  area = sum((x1 - x0) * (y0 + y1) / 2 for x0, x1, y0, y1 in zip(xs, xs[1:], ys, ys[1:]))
  return float(area / span)


def stability(evals: Sequence[float], target: float | None, hold: float | None) -> float | None:
  """How well a run stays learnt once it has got there: ``evals`` are its evaluation returns in
  the order they were made.

  Among the evaluations strictly after the first one >= ``target``, the fraction >= ``hold``;
  1.0 when that first one is the last evaluation (nothing after it fell). None (undefined) when
  no evaluation reached ``target``, or the row has no target or no hold threshold.
  """
  if target is None or hold is None:
    return None
  first = next((i for i, r in enumerate(evals) if r >= target), None)
  if first is None:
    return None
  after = evals[first + 1:]
  if not after:
    return 1.0
  return sum(r >= hold for r in after) / len(after)


def _trimmed_mean_sorted(values: np.ndarray) -> np.ndarray:
  """The interquartile mean along the last axis: ``values`` [..., n], sorted along that axis;
  returns [...]. int(0.25 n) values are cut from each end (scipy.stats.trim_mean(x, 0.25), as
  rliable does) and the rest averaged."""
  n = values.shape[-1]
  cut = int(0.25 * n)
  return values[..., cut:n - cut].mean(axis=-1)


def iqm(values: Sequence[float]) -> float | None:
  """The interquartile mean of ``values`` (n of them): sorted, int(0.25 n) cut from each end
  (rliable's scipy.stats.trim_mean(x, 0.25)), the middle ones averaged; so for n = 8 the mean
  of the middle 4, for n = 5 of the middle 3, for n < 4 of all. None when empty."""
  if len(values) == 0:
    return None
  return float(_trimmed_mean_sorted(np.sort(np.asarray(values, np.float64))))


def iqm_bootstrap_ci(values: Sequence[float], resamples: int = BOOTSTRAP_RESAMPLES,
                     confidence: float = 0.95, seed: int = BOOTSTRAP_SEED
                     ) -> tuple[float, float] | tuple[None, None]:
  """Percentile-bootstrap interval of ``iqm(values)`` over the seeds: ``resamples`` draws of
  n values from the n ``values`` with replacement, the IQM of each, and the (1 - confidence) / 2
  and (1 + confidence) / 2 quantiles of those IQMs. Deterministic for a given ``seed``; a point
  when all values are equal; (None, None) when empty."""
  x = np.asarray(values, np.float64)
  if x.size == 0:
    return None, None
  rng = np.random.default_rng(seed)
  samples = np.sort(x[rng.integers(0, x.size, size=(resamples, x.size))], axis=1)
  stats = _trimmed_mean_sorted(samples)  # [resamples]
  lo, hi = np.quantile(stats, [(1 - confidence) / 2, (1 + confidence) / 2])
  return float(lo), float(hi)


def run_metrics(evals: Sequence[dict], target: float | None, hold: float | None) -> dict:
  """The per-run figures from summary.json's ``evals`` (in the order they were made).

  Returns best, final, last5 (mean of the last ``LAST_K``), the env steps / wall seconds / opt
  steps of the first evaluation >= ``target`` (None if none), auc (``trapezoid_mean`` over env
  steps), solved (best >= target), held (final and last5 >= ``hold``) and stability
  (``stability``: None unless it reached the target); solved / held are None when the row has no
  target / hold, False when there are no evaluations.
  """
  rewards = [float(e["eval_reward"]) for e in evals]
  first = next((e for e in evals if target is not None and e["eval_reward"] >= target), None)
  out = {
      "n_evals": len(evals), "target": target, "hold": hold,
      "best": max(rewards) if rewards else None,
      "final": rewards[-1] if rewards else None,
      "last5": float(statistics.fmean(rewards[-LAST_K:])) if rewards else None,
      "target_env_steps": first["env_steps"] if first else None,
      "target_wall_s": first["wall_s"] if first else None,
      "target_opt_steps": first["opt_steps"] if first else None,
      "auc": trapezoid_mean([e["env_steps"] for e in evals], rewards),
      "stability": stability(rewards, target, hold),
  }
  out["solved"] = None if target is None else bool(rewards) and out["best"] >= target
  out["held"] = (None if hold is None else
                 bool(rewards) and out["final"] >= hold and out["last5"] >= hold)
  return out


def _median_worst(values: list[float], worst=min) -> dict:
  """{"median", "worst"} of ``values`` (None when empty); infinities come back as None."""
  if not values:
    return {"median": None, "worst": None}
  finite = lambda x: None if math.isinf(x) else x
  return {"median": finite(statistics.median(values)), "worst": finite(worst(values))}


def aggregate(runs: Sequence[dict]) -> dict:
  """One cell's figures from its runs' ``run_metrics`` dicts (each with ``failed``: bool).

  seeds: the number of runs, failed among them; solved / held: how many (None for a report-only
  row); best / final / last5 / auc: median and worst (min) over the runs that did not fail;
  target_env_steps / target_wall_s: median and worst (max) over every run, one that never reached
  the target or failed counting as infinite (reported as None), plus ``reached``: how many did;
  stability: median and worst (min) over the runs that did not fail and reached the target, and
  stable: how many of them have stability >= ``STABLE`` (None for a report-only row);
  iqm_final / iqm_auc: {"iqm", "low", "high"}, the IQM over the runs that did not fail of the
  final evaluation / the AUC and its bootstrap 95% interval over seeds (``iqm_bootstrap_ci``).
  """
  ok = [r for r in runs if not r["failed"]]
  target = next((r["target"] for r in runs), None)
  hold = next((r["hold"] for r in runs), None)
  out = {"seeds": len(runs), "failed": len(runs) - len(ok),
         "solved": None if target is None else sum(bool(r["solved"]) for r in ok),
         "held": None if hold is None else sum(bool(r["held"]) for r in ok)}
  for key in ("best", "final", "last5", "auc"):
    out[key] = _median_worst([r[key] for r in ok if r.get(key) is not None])
  for key in ("target_env_steps", "target_wall_s"):
    if target is None:
      out[key] = {"median": None, "worst": None, "reached": None}
      continue
    values = [math.inf if r["failed"] or r.get(key) is None else r[key] for r in runs]
    out[key] = {**_median_worst(values, worst=max),
                "reached": sum(not math.isinf(v) for v in values)}
  # r.get: records written before stability existed have no such key.
  stabilities = [r["stability"] for r in ok if r.get("stability") is not None]
  out["stability"] = _median_worst(stabilities)
  out["stable"] = (None if target is None or hold is None else
                   sum(x >= STABLE for x in stabilities))
  for key in ("final", "auc"):
    values = [r[key] for r in ok if r.get(key) is not None]
    low, high = iqm_bootstrap_ci(values)
    out[f"iqm_{key}"] = {"iqm": iqm(values), "low": low, "high": high}
  return out


# --- running --------------------------------------------------------------------------------------
@dataclasses.dataclass
class Job:
  row: str
  mode: str
  seed: int
  logdir: Path
  command: list[str]


def build_jobs(rows: Sequence[str], modes: Sequence[str], seeds: Sequence[int], out: Path,
               extra: Sequence[str]) -> list[Job]:
  """The matrix in run order: row, then mode, then seed (a cell's seeds run back to back)."""
  jobs = []
  for row in rows:
    for mode in modes:
      for seed in seeds:
        logdir = out / "runs" / row / mode / f"seed{seed}"
        # --overwrite: the run directory is this script's; a rerun (--resume after a failure)
        # replaces the failed run's files instead of being refused.
        command = [sys.executable, ROWS[row].script, *ROWS[row].flags, *MODES[mode],
                   "--seed", str(seed), "--logdir", str(logdir), "--no-progress", "--overwrite",
                   *extra]
        jobs.append(Job(row, mode, seed, logdir, command))
  return jobs


def git_state() -> dict:
  """Commit and whether tracked files differ from it (untracked files, e.g. --out, don't count)."""
  def git(*args):
    try:
      return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                            timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
      return ""
  changed = git("status", "--porcelain", "--untracked-files=no")
  return {"commit": git("rev-parse", "--short", "HEAD") or None, "dirty": bool(changed),
          "changed": changed.splitlines()}


def read_json(path: Path) -> dict | None:
  try:
    return json.loads(path.read_text())
  except (OSError, ValueError):
    return None


def is_done(job: Job) -> bool:
  """A finished, successful run: summary.json there, not interrupted, not recorded as failed."""
  summary = read_json(job.logdir / "summary.json")
  status = read_json(job.logdir / "bench_run.json") or {}
  return (summary is not None and not summary.get("interrupted", False)
          and not status.get("failed", False))


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
  try:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
  except OSError:
    return ""


def kill_group(proc: subprocess.Popen) -> None:
  """SIGTERM to the run's process group (its process actors included), SIGKILL if it lingers;
  then SIGKILL to whatever of the group outlived its leader (an actor stuck in a call)."""
  for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
    try:
      os.killpg(proc.pid, sig)
    except ProcessLookupError:
      return
    try:
      proc.wait(wait)
      break
    except subprocess.TimeoutExpired:
      pass
  try:
    os.killpg(proc.pid, signal.SIGKILL)
  except ProcessLookupError:
    pass


def execute(job: Job, timeout: float, git: dict) -> dict:
  """Runs one job to its end or ``timeout``; writes and returns its bench_run.json record."""
  job.logdir.mkdir(parents=True, exist_ok=True)
  for stale in ("summary.json", "bench_run.json"):
    (job.logdir / stale).unlink(missing_ok=True)
  status = {"command": job.command, "cwd": str(ROOT), "git": git, "returncode": None,
            "timed_out": False, "failed": True, "process_wall_s": None}
  # Unbuffered, so that stdout and stderr interleave in log.txt as they happened. A session of
  # its own: Ctrl-C here does not reach the run (we stop it), and killpg reaches its actors.
  env = {**os.environ, "PYTHONUNBUFFERED": "1", **dict(ROWS[job.row].env)}
  start = time.perf_counter()
  with open(job.logdir / "log.txt", "w") as log:
    log.write(f"$ {shlex.join(job.command)}\n")
    log.flush()
    proc = subprocess.Popen(job.command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    try:
      status["returncode"] = proc.wait(timeout)
    except subprocess.TimeoutExpired:
      status["timed_out"] = True
      kill_group(proc)
      status["returncode"] = proc.returncode
    except BaseException:  # Ctrl-C: stop the run, leave it unfinished (--resume reruns it)
      kill_group(proc)
      raise
  status["process_wall_s"] = time.perf_counter() - start
  status["failed"] = (status["timed_out"] or status["returncode"] != 0
                      or read_json(job.logdir / "summary.json") is None)
  (job.logdir / "bench_run.json").write_text(json.dumps(status, indent=1))
  return status


def collect(job: Job) -> dict:
  """One run's record for results.json: figures, totals, command and status, from its files."""
  row = ROWS[job.row]
  summary = read_json(job.logdir / "summary.json")
  status = read_json(job.logdir / "bench_run.json") or {}
  failed = summary is None or summary.get("interrupted", False) or status.get("failed", False)
  record = {"row": job.row, "mode": job.mode, "seed": job.seed, "logdir": str(job.logdir),
            "command": status.get("command", job.command),
            "command_str": shlex.join(status.get("command", job.command)),
            "git": status.get("git"), "failed": bool(failed),
            "returncode": status.get("returncode"), "timed_out": status.get("timed_out", False),
            "process_wall_s": status.get("process_wall_s")}
  record.update(run_metrics((summary or {}).get("evals", []), row.target, row.hold))
  for key in ("env_steps", "opt_steps", "wall_s"):
    record[f"total_{key}"] = (summary or {}).get(key)
  record["curve"] = [[e["env_steps"], e["eval_reward"]] for e in (summary or {}).get("evals", [])]
  if failed:
    record["why"] = ("timed out" if status.get("timed_out") else
                     f"exit {status['returncode']}" if status.get("returncode") not in (None, 0) else
                     "interrupted" if summary and summary.get("interrupted") else
                     "no summary.json")
    record["log_tail"] = log_tail(job.logdir / "log.txt")
  return record


# --- reporting ------------------------------------------------------------------------------------
def fmt_return(x) -> str:
  return "-" if x is None else f"{x:.1f}"


def fmt_steps(x) -> str:
  return "-" if x is None else f"{x:,.0f}"


def fmt_secs(x) -> str:
  return "-" if x is None else f"{x:.1f}"


def fmt_stability(x) -> str:
  return "-" if x is None else f"{x:.2f}"


def pair(d: dict, fmt) -> str:
  return f"{fmt(d['median'])} / {fmt(d['worst'])}"


def interval(d: dict, fmt) -> str:
  """An IQM and its interval: "498.2 [471.0, 500.0]"; "-" when there were no values."""
  if d["iqm"] is None:
    return "-"
  return f"{fmt(d['iqm'])} [{fmt(d['low'])}, {fmt(d['high'])}]"


def frac(k, n) -> str:
  return "-" if k is None else f"{k}/{n}"


def markdown(records: list[dict], cells: dict, header: list[str]) -> str:
  lines = [*header, "",
           "| row | mode | seeds | solved | held | best | final | last-5 mean "
           "| env steps to target | wall s to target | AUC | stability | stable "
           "| IQM final [95% CI] | IQM AUC [95% CI] |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for (row, mode), a in cells.items():
    seeds = f"{a['seeds']}" + (f" ({a['failed']} failed)" if a["failed"] else "")
    lines.append(
        f"| {row} | {mode} | {seeds} | {frac(a['solved'], a['seeds'])} "
        f"| {frac(a['held'], a['seeds'])} | {pair(a['best'], fmt_return)} "
        f"| {pair(a['final'], fmt_return)} | {pair(a['last5'], fmt_return)} "
        f"| {pair(a['target_env_steps'], fmt_steps)} | {pair(a['target_wall_s'], fmt_secs)} "
        f"| {pair(a['auc'], fmt_return)} | {pair(a['stability'], fmt_stability)} "
        f"| {frac(a['stable'], a['seeds'])} | {interval(a['iqm_final'], fmt_return)} "
        f"| {interval(a['iqm_auc'], fmt_return)} |")
  lines += ["", "| row | mode | seed | best | final | last-5 mean | env steps to target "
            "| wall s to target | AUC | env steps | wall s | stability |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in records:
    seed = f"{r['seed']}" + (f" (failed: {r['why']})" if r["failed"] else "")
    lines.append(
        f"| {r['row']} | {r['mode']} | {seed} | {fmt_return(r['best'])} "
        f"| {fmt_return(r['final'])} | {fmt_return(r['last5'])} "
        f"| {fmt_steps(r['target_env_steps'])} | {fmt_secs(r['target_wall_s'])} "
        f"| {fmt_return(r['auc'])} | {fmt_steps(r['total_env_steps'])} "
        f"| {fmt_secs(r['total_wall_s'])} | {fmt_stability(r.get('stability'))} |")
  failed = [r for r in records if r["failed"]]
  if failed:
    lines += ["", "Failed runs (log tails in results.json):"]
    lines += [f"- {r['row']} {r['mode']} seed {r['seed']}: {r['why']}, "
              f"{Path(r['logdir']) / 'log.txt'}" for r in failed]
  return "\n".join(lines) + "\n"


def legend(rows: Sequence[str]) -> str:
  """What the columns mean, with the selected rows' targets and hold thresholds."""
  thresholds = ", ".join(f"{n} {ROWS[n].target:g} / {ROWS[n].hold:g}" for n in rows
                         if ROWS[n].target is not None and ROWS[n].hold is not None)
  return (
      f"Targets / hold thresholds: {thresholds or 'none (report-only rows)'}. "
      "Per cell: solved = seeds whose best evaluation >= target; held = seeds whose final "
      "evaluation and last-5 mean are both >= the hold threshold; both out of the seeds run (a "
      "failed run counts as neither). Returns and AUC: median / worst (min) over the runs that "
      "did not fail. To target: env steps and trainer wall seconds (from the trainer's start: "
      "imports excluded, compilation (or loading it from the compile cache) and process "
      "actors' start-up included) at the first "
      "evaluation >= target, median / worst (max), a seed that never got there counted as "
      "infinitely slow ('-'). AUC: trapezoid area under the eval-return curve over env steps "
      "divided by the env-step span from the first to the last evaluation, i.e. the mean eval "
      "return over training, in return units. Stability: of the evaluations after the first one "
      ">= target, the fraction >= the hold threshold (1.00 when that first one was the last; '-' "
      "when none reached the target), median / worst (min) over the seeds that reached the "
      f"target; stable = seeds with stability >= {STABLE:g}, out of the seeds run. IQM: the "
      "interquartile mean over seeds (sorted, a quarter cut from each end, rounded down, as "
      "rliable's trim_mean(x, 0.25)) of the final evaluation / the AUC of the runs that did not "
      f"fail, with its 95% percentile-bootstrap interval ({BOOTSTRAP_RESAMPLES} resamplings of "
      "the seeds with replacement, a fixed random seed).")




def worst_run(runs: Sequence[dict]) -> dict | None:
  """The cell's worst seed among the runs that did not fail and have evaluations: the lowest
  final evaluation, ties broken by the lowest last-5 mean (then the first in ``runs``)."""
  ok = [r for r in runs if not r["failed"] and r.get("final") is not None]
  return min(ok, key=lambda r: (r["final"], r["last5"]), default=None)


# Above this many seeds the legend leaves out the per-seed lines (20 entries would hide the plot).
LEGEND_MAX_SEEDS = 8


def draw_cell(ax, row: str, mode: str, runs: Sequence[dict]) -> None:
  """One cell's curves on ``ax``: ``jaxasync.plot.draw_curves`` (seeds thin, median bold, range
  shaded), the worst seed (``worst_run``) highlighted when there are several, the target
  dashed."""
  drawn = [r for r in runs if r["curve"] and not r["failed"]]
  curves = {f"seed {r['seed']}": ([p[0] for p in r["curve"]], [p[1] for p in r["curve"]])
            for r in drawn}
  draw_curves(ax, curves)
  worst = worst_run(drawn)
  if worst is not None and len(drawn) > 1:
    xs, ys = zip(*worst["curve"])
    ax.plot(xs, ys, color="tab:orange", lw=1.8, zorder=3,
            label=f"worst: seed {worst['seed']} (final {fmt_return(worst['final'])})")
  if ROWS[row].target is not None:
    ax.axhline(ROWS[row].target, color="tab:red", ls="--", lw=1,
               label=f"target {ROWS[row].target:g}")
  failed = sum(r["failed"] for r in runs)
  ax.set_title(f"{row}, {mode}, seeds {format_seeds([r['seed'] for r in runs])}"
               + (f" ({failed} failed)" if failed else ""))
  ax.set_xlabel("env steps")
  ax.set_ylabel("eval return")
  ax.grid(alpha=0.3)
  handles, labels = ax.get_legend_handles_labels()
  if len(curves) > LEGEND_MAX_SEEDS:
    keep = [i for i, label in enumerate(labels) if label not in curves]
    handles, labels = [handles[i] for i in keep], [labels[i] for i in keep]
  ax.legend(handles, labels, fontsize=7, loc="best")


def plot_cells(records: list[dict], out: Path) -> list[str]:
  """One PNG per cell, drawn by ``draw_cell``; [] (and one line printed) when matplotlib is
  missing."""
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    print("pip install matplotlib for the learning-curve PNGs")
    return []
  written = []
  cells: dict[tuple[str, str], list[dict]] = {}
  for r in records:
    cells.setdefault((r["row"], r["mode"]), []).append(r)
  for (row, mode), runs in cells.items():
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    draw_cell(ax, row, mode, runs)
    fig.tight_layout()
    path = out / f"{row}-{mode}.png"
    fig.savefig(path)
    plt.close(fig)
    written.append(str(path))
  return written


# --- main -----------------------------------------------------------------------------------------
def run_matrix(jobs: list[Job], args: argparse.Namespace, git: dict) -> bool:
  """Runs (or with --resume skips) each job in turn, printing a line per run; True if stopped
  by Ctrl-C (or SIGTERM / SIGHUP)."""
  for i, job in enumerate(jobs, 1):
    name = f"[{i}/{len(jobs)}] {job.row} {job.mode} seed {job.seed}"
    if args.resume and is_done(job):
      recorded = (read_json(job.logdir / "bench_run.json") or {}).get("command")
      # Resuming with other flags would mix settings in one table: say so (results.json keeps
      # each run's own command).
      differs = recorded is not None and recorded != job.command
      print(f"{name}: done, skipped (--resume)"
            + (f"; WARNING: it ran as {shlex.join(recorded)}" if differs else ""), flush=True)
      continue
    try:
      timeout = args.timeout if args.timeout is not None else ROWS[job.row].timeout
      status = execute(job, timeout, git)
    except KeyboardInterrupt:
      print(f"\n{name}: interrupted; its run was stopped. Rerun with --resume to continue.",
            flush=True)
      return True
    r = collect(job)
    if r["failed"]:
      print(f"{name}: FAILED ({r['why']}) after {status['process_wall_s']:.0f} s; "
            f"{job.logdir / 'log.txt'}:\n{r['log_tail']}", flush=True)
    else:
      reached = ("" if r["target"] is None else
                 f", target {r['target']:g} at {fmt_steps(r['target_env_steps'])} env steps "
                 f"({fmt_secs(r['target_wall_s'])} s), stability "
                 f"{fmt_stability(r['stability'])}" if r["solved"] else
                 f", target {r['target']:g} not reached")
      print(f"{name}: best {fmt_return(r['best'])} final {fmt_return(r['final'])} last-5 "
            f"{fmt_return(r['last5'])}{reached}; {fmt_steps(r['total_env_steps'])} env steps, "
            f"{status['process_wall_s']:.0f} s", flush=True)
  return False


SEEDS_HELP = "integers and inclusive ranges: --seeds 0 1 2, --seeds 0-19, --seeds 0-4 10 12-13"


def seed_spec(word: str) -> list[int]:
  """One word of --seeds as the seeds it names: "7" -> [7], "0-4" -> [0, 1, 2, 3, 4] (both ends
  included). Raises argparse.ArgumentTypeError, saying what is wrong and how to write it."""
  if re.fullmatch(r"-?\d+", word):
    return [int(word)]
  m = re.fullmatch(r"(\d+)-(\d+)", word)
  if m is None:
    raise argparse.ArgumentTypeError(f"{word!r} is not a seed or a range of seeds; give "
                                     f"{SEEDS_HELP}")
  lo, hi = int(m[1]), int(m[2])
  if lo > hi:
    raise argparse.ArgumentTypeError(f"range {word!r} runs downwards; write it low-high: "
                                     f"{hi}-{lo}")
  return list(range(lo, hi + 1))


def parse_seeds(words: Sequence[str]) -> list[int]:
  """--seeds' words as one list of seeds, in the order given ("0-4 10 12-13" -> 0 1 2 3 4 10 12
  13). Raises argparse.ArgumentTypeError on a bad word or on a seed named twice (its run
  directory would be run, and counted, twice)."""
  seeds = [seed for word in words for seed in seed_spec(word)]
  twice = sorted({s for s in seeds if seeds.count(s) > 1})
  if twice:
    raise argparse.ArgumentTypeError(
        f"seed(s) {' '.join(map(str, twice))} named more than once in {' '.join(words)!r}; "
        "name each seed once")
  return seeds


def format_seeds(seeds: Sequence[int]) -> str:
  """Seeds as --seeds would take them, consecutive runs as ranges: [0, 1, 2, 3, 4, 10, 12, 13]
  -> "0-4 10 12-13" (the inverse of ``parse_seeds``, order kept)."""
  spans: list[list[int]] = []  # [first, last] of each run of consecutive seeds
  for seed in seeds:
    if spans and seed == spans[-1][1] + 1:
      spans[-1][1] = seed
    else:
      spans.append([seed, seed])
  return " ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--rows", nargs="+", choices=list(ROWS),
                 default=[name for name, row in ROWS.items() if row.default])
  p.add_argument("--modes", nargs="+", choices=list(MODES), default=["sync", "thread", "process"])
  # Strings here, expanded below: a range's error then names the word as written.
  p.add_argument("--seeds", nargs="+", default=["0-4"], help=SEEDS_HELP)
  p.add_argument("--out", default="bench_learning_out",
                 help="runs, results.json, results.md and the PNGs go here")
  p.add_argument("--resume", action="store_true",
                 help="skip runs whose summary.json exists (and did not fail)")
  p.add_argument("--timeout", type=float, default=None,
                 help="seconds per run before it is killed and recorded as failed; default: "
                      "the row's (900, hours for the MuJoCo and MinAtar rows)")
  p.add_argument("--extra", action="append", default=[],
                 help="flags appended to every run, one string split like a shell line "
                      "(repeatable): --extra \"--max-opts 20000 --eval-interval 500\"; one flag alone "
                      "needs the '=': --extra=--agent.no-layer-norm")
  p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
  args = p.parse_args(argv)
  try:
    args.seeds = parse_seeds(args.seeds)
  except argparse.ArgumentTypeError as e:
    p.error(f"argument --seeds: {e}")
  return args


def main(argv: Sequence[str] | None = None) -> dict | None:
  args = parse_args(argv)
  out = Path(args.out).resolve()
  extra = [a for chunk in args.extra for a in shlex.split(chunk)]
  jobs = build_jobs(args.rows, args.modes, args.seeds, out, extra)
  invocation = shlex.join([sys.executable, *sys.argv] if argv is None
                          else [sys.executable, "scripts/bench_learning.py", *argv])

  if args.dry_run:
    for job in jobs:
      done = args.resume and is_done(job)
      print(("# done, skipped by --resume: " if done else "") + shlex.join(job.command))
    return None

  git = git_state()
  print(f"jaxasync learning dashboard: {len(args.rows)} row(s) x {len(args.modes)} mode(s) x "
        f"{len(args.seeds)} seed(s) = {len(jobs)} runs, one at a time, in {out} "
        f"(git {git['commit']}{', modified' if git['dirty'] else ''})", flush=True)
  start = time.perf_counter()
  # Runs are in sessions of their own (see execute), so a SIGTERM or SIGHUP that ends this
  # process would leave the run going: take them as Ctrl-C, which stops it.
  previous = {}
  if threading.current_thread() is threading.main_thread():
    for sig in (signal.SIGTERM, signal.SIGHUP):
      previous[sig] = signal.signal(sig, signal.default_int_handler)
  try:
    interrupted = run_matrix(jobs, args, git)
  finally:
    for sig, handler in previous.items():
      signal.signal(sig, handler)

  # The tables cover every run of the matrix that has files, this invocation's or an earlier one's.
  records = [collect(job) for job in jobs
             if (job.logdir / "summary.json").exists() or (job.logdir / "bench_run.json").exists()]
  cells: dict[tuple[str, str], dict] = {}
  for row in args.rows:
    for mode in args.modes:
      runs = [r for r in records if (r["row"], r["mode"]) == (row, mode)]
      if runs:
        cells[(row, mode)] = aggregate(runs)
  commits = sorted({(r["git"] or {}).get("commit") or "?" for r in records})
  header = ["# jaxasync learning dashboard", "",
            f"`{invocation}`", "",
            f"git {', '.join(commits)}" + (" (runs from different commits!)" if len(commits) > 1
                                           else "")
            + (", tracked files modified" if any((r["git"] or {}).get("dirty") for r in records)
               else "")
            + ("" if not extra else f"; extra flags: `{shlex.join(extra)}`"), "",
            legend(args.rows)]
  md = markdown(records, cells, header)
  out.mkdir(parents=True, exist_ok=True)
  (out / "results.md").write_text(md)
  pngs = plot_cells(records, out) if records else []
  result = {
      "invocation": invocation, "args": vars(args), "extra": extra, "git": git,
      "rows": {n: dataclasses.asdict(ROWS[n]) for n in args.rows},
      "modes": {m: list(MODES[m]) for m in args.modes},
      "cells": [{"row": row, "mode": mode, **a} for (row, mode), a in cells.items()],
      "runs": records, "interrupted": interrupted, "pngs": pngs,
      "wall_s": time.perf_counter() - start,
  }
  (out / "results.json").write_text(json.dumps(result, indent=1, default=float))
  print("\n" + md)
  print(f"results: {out / 'results.md'}, {out / 'results.json'}"
        + (f", {len(pngs)} PNG(s) in {out}" if pngs else ""))
  print(f"command: {invocation}")
  if interrupted:
    sys.exit(130)
  return result


if __name__ == "__main__":
  main()
