"""The MinAtar results as curves: one panel per game, one colour per algorithm, against env steps
(top row) and against trainer seconds (bottom row), with the MinAtar paper's DQN figure dashed.

  python scripts/plot_minatar.py bench_learning_out/runs/*minatar*/*/seed*   # add runs, draw
  python scripts/plot_minatar.py                                            # redraw the archive

Runs are read from their --logdir (``config.json`` and ``summary.json``) and merged into an
archive of curves (``--archive``, default ``docs/minatar/curves.json``: algorithm, game, seed,
mode, commit, and each evaluation's env steps, trainer seconds and return), so the figure can be
redrawn after the run directories are gone; a run already archived (same algorithm, game, seed
and mode) is replaced by the newer one. Writes ``--out`` (default
``docs/plots/minatar_curves.png``) and prints one markdown line per archived run: best, final
and the env steps to the paper's figure.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_learning import MINATAR_GAMES, MINATAR_TARGETS  # noqa: E402

from jaxasync import experiment  # noqa: E402
from jaxasync.errors import ConfigError  # noqa: E402
from jaxasync.plot import draw_curves, read_summary  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
ARCHIVE = REPO / "docs" / "minatar" / "curves.json"
OUT = REPO / "docs" / "plots" / "minatar_curves.png"
ALGO_ORDER = ("dqn", "rainbow", "ppo", "impala", "pqn")


def algo_rank(algo: str) -> int:
  """Where ``algo`` comes in tables and colours: ALGO_ORDER's, then any other after them."""
  return ALGO_ORDER.index(algo) if algo in ALGO_ORDER else len(ALGO_ORDER)


def _fail(run_dir: Path, problem: str) -> ValueError:
  return ValueError(f"{run_dir}: {problem}; pass a finished MinAtar run's --logdir.")


def read_run(run_dir: str | Path) -> dict:
  """One run's archive entry from its ``--logdir``; ``ValueError`` (one line naming the
  directory, the problem and the fix) when it is not a finished MinAtar run."""
  run_dir = Path(run_dir)
  try:
    _, config = experiment.read_run_config(run_dir)
  except ConfigError as e:  # names the file and what to pass instead
    raise ValueError(str(e).removeprefix("--config ")) from None
  settings = config["settings"]
  env_id = str(settings.get("env_id") or "")
  game = env_id.removeprefix("MinAtar/").removesuffix("-v1")
  if game not in MINATAR_GAMES:
    raise ValueError(f"{run_dir} ran {env_id or 'no env id'}, not a MinAtar game "
                     f"({', '.join(MINATAR_GAMES)}); leave it out.")
  algo = config.get("algo")
  commit = (config.get("provenance") or {}).get("git_commit")
  seed = settings.get("run.seed")
  if not algo or not commit or seed is None:
    raise _fail(run_dir, "its config.json names no algorithm, commit or seed")
  try:
    summary = read_summary(run_dir)
    evals = sorted(({"env_steps": int(e["env_steps"]), "wall_s": float(e["wall_s"]),
                     "eval_reward": float(e["eval_reward"])}
                    for e in summary.get("evals", []) if e.get("eval_reward") is not None),
                   key=lambda e: e["env_steps"])
  except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
    raise _fail(run_dir, f"its summary.json cannot be read ({type(e).__name__}: {e})") from None
  if summary.get("interrupted") or summary.get("error"):
    raise _fail(run_dir, "the run was interrupted or failed")
  if not evals:
    raise _fail(run_dir, "its summary.json has no evaluations")
  return {"algo": algo, "game": game, "seed": seed,
          # The mode that ran (a preset's "auto" resolves to one), as the summary records it.
          "mode": summary.get("mode") or settings.get("actors.mode"),
          "commit": commit[:7] + ("+dirty" if config["provenance"].get("git_dirty") else ""),
          "env_steps": [e["env_steps"] for e in evals],
          "wall_s": [round(e["wall_s"], 1) for e in evals],
          "eval_reward": [e["eval_reward"] for e in evals]}


def merge(archive: list[dict], runs: list[dict]) -> list[dict]:
  """``archive`` with ``runs`` added, each replacing the entry of the same algorithm, game,
  seed and mode (a rerun at a newer commit is the cell's current figure, not another seed);
  sorted by game, algorithm and seed."""
  def key(r):
    return r["algo"], r["game"], r["seed"], r["mode"]
  merged = {key(r): r for r in archive}
  merged.update({key(r): r for r in runs})
  def order(r):
    return MINATAR_GAMES.index(r["game"]), algo_rank(r["algo"]), r["algo"], r["seed"]
  return sorted(merged.values(), key=order)


def target_env_steps(run: dict, target: float) -> int | None:
  """The env steps of the run's first evaluation at or above ``target``; None if none was."""
  return next((s for s, r in zip(run["env_steps"], run["eval_reward"]) if r >= target), None)


def table_lines(archive: list[dict]) -> list[str]:
  """A markdown table, one line per archived run: its last env step, best and final return,
  and the env steps to the MinAtar paper's DQN figure for its game."""
  lines = ["| game | algorithm | seed | mode | commit | env steps | best | final "
           "| env steps to the paper's DQN figure |", "|---|---|---|---|---|---|---|---|---|"]
  for r in archive:
    paper = MINATAR_TARGETS["dqn", r["game"]]
    reached = target_env_steps(r, paper)
    lines.append(f"| {r['game']} | {r['algo']} | {r['seed']} | {r['mode']} | {r['commit']} "
                 f"| {r['env_steps'][-1]:,} | {max(r['eval_reward']):.1f} "
                 f"| {r['eval_reward'][-1]:.1f} "
                 f"| {f'{reached:,}' if reached is not None else f'not reached ({paper:g})'} |")
  return lines


def plot(archive: list[dict], out: Path) -> Path:
  """Two rows (env steps, trainer seconds) of one panel per game; one colour per algorithm,
  its seeds drawn by ``jaxasync.plot.draw_curves``."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  algos = sorted({r["algo"] for r in archive}, key=algo_rank)
  cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  # One colour per algorithm in every figure, whichever algorithms it has.
  others = [a for a in algos if a not in ALGO_ORDER]
  colors = {a: cycle[(algo_rank(a) + (others.index(a) if a in others else 0)) % len(cycle)]
            for a in algos}
  fig, axes = plt.subplots(2, len(MINATAR_GAMES), figsize=(4 * len(MINATAR_GAMES), 7), dpi=80)
  for col, game in enumerate(MINATAR_GAMES):
    for row, (x_key, x_label) in enumerate((("env_steps", "env steps"),
                                            ("wall_s", "trainer seconds"))):
      ax = axes[row, col]
      for algo in algos:
        runs = [r for r in archive if r["game"] == game and r["algo"] == algo]
        if runs:
          curves = {f"{algo} seed {r['seed']} {r['commit']}": (r[x_key], r["eval_reward"])
                    for r in runs}
          label = algo + (f" ({len(runs)} runs)" if len(runs) > 1 else "")
          draw_curves(ax, curves, colors[algo], label, seed_lines=len(runs) > 1)
      ax.axhline(MINATAR_TARGETS["dqn", game], color="gray", ls="--", lw=1,
                 label="MinAtar paper's DQN, 5M")
      ax.set_title(game if row == 0 else "", fontsize=10)
      ax.set_xlabel(x_label, fontsize=8)
      ax.tick_params(labelsize=7)
      ax.grid(alpha=0.3)
      if col == 0:
        ax.set_ylabel("greedy eval return", fontsize=8)
      if row == 0:
        ax.legend(fontsize=7, loc="best")
  fig.tight_layout()
  out.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(out)
  plt.close(fig)
  return out


def write_json(path: Path, data) -> None:
  """Writes ``data`` to ``path`` whole or not at all: a temporary file beside it, flushed to
  disk, then renamed over it (removed if anything fails before)."""
  path.parent.mkdir(parents=True, exist_ok=True)
  text = json.dumps(data, indent=1) + "\n"
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
  try:
    with os.fdopen(fd, "w") as f:
      f.write(text)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    Path(tmp).unlink(missing_ok=True)
    raise


def read_archive(path: Path) -> list[dict]:
  """The archived runs; [] when there is no archive yet; ``ValueError`` if it is unreadable."""
  if not path.exists():
    return []
  try:
    archive = json.loads(path.read_text())
  except (OSError, ValueError) as e:
    raise ValueError(f"{path} cannot be read as JSON ({e}); restore it from git "
                     "(git checkout -- docs/minatar/curves.json) or pass --archive.") from None
  if not isinstance(archive, list):
    raise ValueError(f"{path} is not a list of runs; restore it from git or pass --archive.")
  return archive


def main(argv: list[str] | None = None) -> list[dict]:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("runs", nargs="*", help="finished MinAtar runs' --logdir to archive")
  parser.add_argument("--archive", type=Path, default=ARCHIVE, help="the curves' archive")
  parser.add_argument("--out", type=Path, default=OUT, help="the PNG to write")
  args = parser.parse_args(argv)
  try:
    new = [read_run(d) for d in args.runs]
    archive = read_archive(args.archive)
  except ValueError as e:
    parser.error(str(e))
  if not archive and not new:
    parser.error(f"{args.archive} does not exist; name finished runs to start it.")
  archive = merge(archive, new)
  if new:
    write_json(args.archive, archive)
  print(f"wrote {plot(archive, args.out)} ({len(archive)} runs)")
  print("\n".join(table_lines(archive)))
  return archive


if __name__ == "__main__":
  main()
