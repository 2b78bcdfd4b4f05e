"""The MinAtar results as curves: one panel per game, one colour per algorithm, against env steps
(top row) and against trainer seconds (bottom row), with the MinAtar paper's DQN figure dashed.

  python scripts/plot_minatar.py bench_learning_out/runs/*minatar*/*/seed*   # add runs, draw
  python scripts/plot_minatar.py                                            # redraw the archive

Runs are read from their --logdir (``config.json`` and ``summary.json``) and merged into an
archive of curves (``--archive``, default ``docs/minatar/curves.json``: algorithm, game, seed,
mode, commit, and each evaluation's env steps, trainer seconds and return), so the figure can be
redrawn after the run directories are gone; a run already archived (same algorithm, game, seed,
mode and commit) is replaced. Writes ``--out`` (default ``docs/plots/minatar_curves.png``) and
prints one markdown line per archived run: best, final and the env steps to the paper's figure.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_learning import MINATAR_GAMES, MINATAR_TARGETS  # noqa: E402

from jaxasync.plot import _pyplot, draw_curves, read_evals  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
ARCHIVE = REPO / "docs" / "minatar" / "curves.json"
OUT = REPO / "docs" / "plots" / "minatar_curves.png"
ALGO_ORDER = ("dqn", "rainbow", "ppo", "impala", "pqn")


def read_run(run_dir: str | Path) -> dict:
  """One run's archive entry from its ``--logdir``; ``ValueError`` (naming the fix) when it is
  not a finished MinAtar run."""
  run_dir = Path(run_dir)
  config_path = run_dir / "config.json"
  if not config_path.exists():
    raise ValueError(f"{run_dir} has no config.json; pass a run's --logdir.")
  config = json.loads(config_path.read_text())
  settings = config.get("settings", {})
  env_id = settings.get("env_id") or ""
  game = env_id.removeprefix("MinAtar/").removesuffix("-v1")
  if game not in MINATAR_GAMES:
    raise ValueError(f"{run_dir} ran {env_id or 'no env id'}, not a MinAtar game "
                     f"({', '.join(MINATAR_GAMES)}); leave it out.")
  evals = sorted(read_evals(run_dir), key=lambda e: e["env_steps"])
  if not evals:
    raise ValueError(f"{run_dir} has no evaluations in summary.json; is the run finished?")
  provenance = config.get("provenance", {})
  return {"algo": config["algo"], "game": game, "seed": settings.get("run.seed"),
          "mode": settings.get("actors.mode"),
          "commit": (provenance.get("git_commit") or "")[:7] + ("+dirty" if provenance.get(
              "git_dirty") else ""),
          "env_steps": [int(e["env_steps"]) for e in evals],
          "wall_s": [round(float(e["wall_s"]), 1) for e in evals],
          "eval_reward": [float(e["eval_reward"]) for e in evals]}


def merge(archive: list[dict], runs: list[dict]) -> list[dict]:
  """``archive`` with ``runs`` added, each replacing an entry with the same algorithm, game,
  seed, mode and commit; sorted by game, algorithm and seed."""
  def key(r):
    return r["algo"], r["game"], r["seed"], r["mode"], r["commit"]
  merged = {key(r): r for r in archive}
  merged.update({key(r): r for r in runs})
  def order(r):
    algo = ALGO_ORDER.index(r["algo"]) if r["algo"] in ALGO_ORDER else len(ALGO_ORDER)
    return MINATAR_GAMES.index(r["game"]), algo, r["algo"], r["seed"] or 0, r["commit"]
  return sorted(merged.values(), key=order)


def target_env_steps(run: dict, target: float) -> int | None:
  """The env steps of the run's first evaluation at or above ``target``; None if none was."""
  return next((s for s, r in zip(run["env_steps"], run["eval_reward"]) if r >= target), None)


def table_lines(archive: list[dict]) -> list[str]:
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
  plt = _pyplot()
  algos = sorted({r["algo"] for r in archive},
                 key=lambda a: ALGO_ORDER.index(a) if a in ALGO_ORDER else len(ALGO_ORDER))
  cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  # One colour per algorithm in every figure, whichever algorithms it has.
  colors = {a: cycle[(ALGO_ORDER.index(a) if a in ALGO_ORDER else len(ALGO_ORDER) + i)
                     % len(cycle)] for i, a in enumerate(algos)}
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
  """Writes ``data`` to ``path`` whole or not at all (a temporary file, then a rename)."""
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(path.name + ".tmp")
  tmp.write_text(json.dumps(data, indent=1) + "\n")
  os.replace(tmp, path)


def main(argv: list[str] | None = None) -> list[dict]:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("runs", nargs="*", help="finished MinAtar runs' --logdir to archive")
  parser.add_argument("--archive", type=Path, default=ARCHIVE, help="the curves' archive")
  parser.add_argument("--out", type=Path, default=OUT, help="the PNG to write")
  args = parser.parse_args(argv)
  try:
    new = [read_run(d) for d in args.runs]
  except ValueError as e:
    parser.error(str(e))
  archive = json.loads(args.archive.read_text()) if args.archive.exists() else []
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
