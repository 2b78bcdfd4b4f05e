"""Learning curves and throughput of one or many runs, as PNGs.

  python -m jaxasync.plot runs/dqn                         # one run
  python -m jaxasync.plot runs/sweep/seed0 runs/sweep/seed1 runs/other --out plots/
  python -m jaxasync.plot bench/runs/dqn-cartpole/process/seed*   # a bench_learning cell

Writes ``eval_vs_env_steps.png``, ``eval_vs_wall_s.png`` and ``throughput.png`` into ``--out``
(default: the first run's directory). Runs whose paths differ only in a ``seed<N>`` part are
seeds of one configuration: they are drawn as thin lines, their median in bold and their range
shaded (each seed interpolated onto the span every seed covers, so the median is never taken
over extrapolated values). Evaluations come from a run's ``summary.json`` (env steps, trainer
seconds, return); throughput (env steps/s, SGD steps/s, samples/s) from its TensorBoard event
files, read with tensorboardX's protobufs (no TensorFlow or TensorBoard needed).

``--health`` also writes ``health.png`` (``plot_health``): per run, its evaluations over env
steps above its summary's ``health`` series (Q-values against the replay's return bound,
action gap, terminal fraction of the replay, gradient norms, policy entropy).

Needs matplotlib (``pip install 'jaxasync[plot]'``).
"""

from __future__ import annotations

import argparse
import json
import re
import struct
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from jaxasync.ledger import overestimation_margin

Curve = tuple[Sequence[float], Sequence[float]]  # (xs ascending, ys)


# --- curves (pure) ------------------------------------------------------------------------------
def common_grid(curves: Sequence[Curve], points: int = 200) -> np.ndarray:
  """``points`` xs from the latest first x to the earliest last x over ``curves``: where every
  curve is defined. Empty when they do not overlap."""
  curves = [c for c in curves if len(c[0])]
  if not curves:
    return np.zeros(0)
  lo, hi = max(c[0][0] for c in curves), min(c[0][-1] for c in curves)
  return np.linspace(lo, hi, points) if hi > lo else np.zeros(0)


def interpolated(curves: Sequence[Curve], grid: Sequence[float]) -> np.ndarray:
  """``[len(curves), len(grid)]``: each curve linearly interpolated at ``grid``, NaN outside
  its own range (where ``np.interp`` would clamp)."""
  grid = np.asarray(grid, np.float64)
  rows = []
  for xs, ys in curves:
    xs, ys = np.asarray(xs, np.float64), np.asarray(ys, np.float64)
    y = np.interp(grid, xs, ys) if len(xs) else np.full(grid.shape, np.nan)
    if len(xs):
      y[(grid < xs[0]) | (grid > xs[-1])] = np.nan
    rows.append(y)
  return np.stack(rows) if rows else np.zeros((0, len(grid)))


def median_curve(curves: Sequence[Curve], grid: Sequence[float]) -> np.ndarray:
  """The median of ``curves`` at ``grid`` (NaN wherever any curve is undefined)."""
  grid = np.asarray(grid, np.float64)
  if not curves:
    return np.full(grid.shape, np.nan)
  return np.median(interpolated(curves, grid), axis=0)


# --- reading runs -------------------------------------------------------------------------------
def read_events(run_dir: str | Path) -> Iterator[Any]:
  """Every event (tensorboardX's ``Event`` protobuf) of every TensorBoard event file in
  ``run_dir`` (a resumed run has several), file by file; a record cut short (a run killed
  mid-write) ends its file."""
  from tensorboardX.proto import event_pb2
  for path in sorted(Path(run_dir).glob("events.out.tfevents.*")):
    data = path.read_bytes()
    pos = 0
    while pos + 12 <= len(data):  # TFRecord: length u64, crc u32, payload, crc u32
      (length,) = struct.unpack("<Q", data[pos:pos + 8])
      start, end = pos + 12, pos + 12 + length
      if end + 4 > len(data):
        break
      yield event_pb2.Event.FromString(data[start:end])
      pos = end + 4


def read_scalars(run_dir: str | Path) -> dict[str, list[tuple[int, float, float]]]:
  """``{tag: [(step, wall_time, value), ...]}`` from every TensorBoard event file in
  ``run_dir``, sorted by wall time."""
  out: dict[str, list[tuple[int, float, float]]] = {}
  for event in read_events(run_dir):
    for value in event.summary.value:
      if value.HasField("simple_value"):
        out.setdefault(value.tag, []).append((event.step, event.wall_time, value.simple_value))
  for rows in out.values():
    rows.sort(key=lambda r: r[1])
  return out


def read_evals(run_dir: str | Path) -> list[dict]:
  """The run's evaluations (``opt_steps``, ``env_steps``, ``wall_s``, ``eval_reward``) from its
  ``summary.json``; ``[]`` when it has none."""
  path = Path(run_dir) / "summary.json"
  if not path.exists():
    return []
  return [e for e in json.loads(path.read_text()).get("evals", [])
          if e.get("eval_reward") is not None]


def read_summary(run: str | Path | dict) -> dict:
  """A run's summary: ``run`` itself when it is one (a dict), else the ``summary.json`` at
  ``run`` (a file) or in it (a run directory)."""
  if isinstance(run, dict):
    return run
  path = Path(run)
  path = path / "summary.json" if path.is_dir() else path
  if not path.exists():
    raise FileNotFoundError(f"{path} does not exist; pass a run's --logdir or its summary.json.")
  return json.loads(path.read_text())


def health_curve(health: Sequence[dict], key: str) -> Curve:
  """``(env_steps, values)`` of ``key`` over a summary's ``health`` records that have it
  (``None``: a non-finite value, dropped)."""
  rows = [r for r in health if r.get(key) is not None]
  return [r["env_steps"] for r in rows], [r[key] for r in rows]


def configuration(run_dir: str | Path) -> str:
  """The configuration a run belongs to: its path with any ``seed<N>`` replaced by ``seed*``."""
  return re.sub(r"seed\d+", "seed*", str(Path(run_dir)))


# --- plotting -----------------------------------------------------------------------------------
def _pyplot():
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    raise ImportError("jaxasync.plot needs matplotlib: pip install 'jaxasync[plot]'") from None
  return plt


def draw_curves(ax, curves: dict[str, Curve], color=None, label: str | None = None,
                seed_lines: bool = True) -> None:
  """One configuration's seeds on ``ax``: thin lines, the median in bold, the range shaded
  (median and range only where every seed is defined)."""
  curves = {k: c for k, c in curves.items() if len(c[0])}
  if seed_lines:
    for name, (xs, ys) in curves.items():
      ax.plot(xs, ys, lw=0.9, alpha=0.4, color=color,
              label=None if color is not None or len(curves) == 1 else name)
  values = list(curves.values())
  grid = common_grid(values)
  if len(values) > 1 and len(grid):
    stacked = interpolated(values, grid)
    ax.fill_between(grid, stacked.min(0), stacked.max(0), color=color or "gray", alpha=0.15)
    ax.plot(grid, np.median(stacked, 0), lw=2.5, color=color or "black",
            label=label or "median")
  elif len(values) == 1 and label:
    xs, ys = values[0]
    ax.plot(xs, ys, lw=2.0, color=color, label=label)


def plot_runs(run_dirs: Sequence[str | Path], out: str | Path | None = None,
              target: float | None = None) -> list[Path]:
  """Writes the three PNGs for ``run_dirs`` (grouped by ``configuration``) into ``out``
  (default: the first run's directory); returns their paths."""
  plt = _pyplot()
  run_dirs = [Path(d) for d in run_dirs]
  if not run_dirs:
    raise ValueError("name at least one run directory (one with a summary.json).")
  for d in run_dirs:
    if not d.is_dir():
      raise FileNotFoundError(f"{d} is not a directory; pass a run's --logdir.")
  out = Path(out) if out is not None else run_dirs[0]
  out.mkdir(parents=True, exist_ok=True)
  groups: dict[str, list[Path]] = {}
  for d in run_dirs:
    groups.setdefault(configuration(d), []).append(d)
  colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  written = []
  for x_key, x_label, name in (("env_steps", "env steps", "eval_vs_env_steps.png"),
                               ("wall_s", "trainer seconds", "eval_vs_wall_s.png")):
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    for i, (group, dirs) in enumerate(groups.items()):
      curves = {}
      for d in dirs:
        evals = sorted(read_evals(d), key=lambda e: e[x_key])
        curves[d.name] = ([e[x_key] for e in evals], [e["eval_reward"] for e in evals])
      color = colors[i % len(colors)] if len(groups) > 1 else None
      draw_curves(ax, curves, color, _short(group, len(dirs)))
    if target is not None:
      ax.axhline(target, color="tab:red", ls="--", lw=1, label=f"target {target:g}")
    ax.set_xlabel(x_label)
    ax.set_ylabel("eval return")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(out / name)
    plt.close(fig)
    written.append(out / name)
  fig, axes = plt.subplots(1, 3, figsize=(13, 3.8), dpi=110)
  for ax, tag, title in zip(axes, ("fps", "opt_steps_per_sec", "samples_per_sec"),
                            ("env steps/s", "SGD steps/s", "samples inserted/s")):
    for i, (group, dirs) in enumerate(groups.items()):
      curves = {}
      for d in dirs:
        rows = read_scalars(d).get(tag, [])
        curves[d.name] = ([r[0] for r in rows], [r[2] for r in rows])
      color = colors[i % len(colors)] if len(groups) > 1 else None
      draw_curves(ax, curves, color, _short(group, len(dirs)))
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("SGD steps")
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=7, loc="best")
  fig.tight_layout()
  fig.savefig(out / "throughput.png")
  plt.close(fig)
  written.append(out / "throughput.png")
  return written


# plot_health's panels, top to bottom: (title, keys drawn as lines, key drawn dashed). A panel
# is drawn when some run recorded one of its keys; q_bound comes with the overestimation
# watch's threshold, dotted (jaxasync.ledger.over_bound). The gradient norms are the agents' (DQN,
# IMPALA, PPO: grad_norm; SAC: its critic's and its actor's), before clipping.
HEALTH_PANELS = (
    ("Q-values and the replay's return bound", ("q_max", "q_mean"), "q_bound"),
    ("action gap (median)", ("action_gap",), None),
    ("terminal fraction of the replay", ("replay_terminal_fraction",), None),
    ("targets clipped at the value bound (fraction)", ("target_clipped",), None),
    ("gradient norm", ("grad_norm", "critic_grad_norm", "actor_grad_norm"), None),
    ("policy entropy", ("entropy",), None),
)


def plot_health(runs: Sequence[str | Path | dict], out: str | Path | None = None,
                labels: Sequence[str] | None = None):
  """Learning health over env steps, one column per run (``read_summary``: summaries, their
  paths or run directories): the evaluation returns, then ``HEALTH_PANELS`` from each
  summary's ``health`` series, rows sharing their y axis so runs compare at a glance, and the
  run's warnings under its column's title. Writes a PNG to ``out`` when given; returns the
  matplotlib ``Figure``."""
  plt = _pyplot()
  if not runs:
    raise ValueError("name at least one run (a summary, its summary.json, or a run directory).")
  summaries = [read_summary(r) for r in runs]
  if labels is None:
    labels = [f"run {i}" if isinstance(r, dict) else
              (Path(r).name if Path(r).is_dir() else Path(r).stem) for i, r in enumerate(runs)]
  panels = [p for p in HEALTH_PANELS
            if any(health_curve(s.get("health", []), k)[0] for s in summaries
                   for k in (*p[1], p[2]) if k)]
  rows = 1 + len(panels)
  fig, axes = plt.subplots(rows, len(summaries), figsize=(4.6 * len(summaries), 2.2 * rows),
                           dpi=100, squeeze=False, sharey="row")
  for j, (summary, label) in enumerate(zip(summaries, labels)):
    warned = any("Q-values above" in w for w in summary.get("warnings") or [])
    axes[0, j].set_title(f"{label}\neval return" + (" (overestimation warned)" if warned else ""),
                         fontsize=9)
    evals = sorted((e for e in summary.get("evals", []) if e.get("eval_reward") is not None),
                   key=lambda e: e["env_steps"])
    axes[0, j].plot([e["env_steps"] for e in evals], [e["eval_reward"] for e in evals],
                    marker=".", color="black")
    health = summary.get("health", [])
    for ax, (title, keys, dashed) in zip(axes[1:, j], panels):
      for key in keys:
        xs, ys = health_curve(health, key)
        if xs:
          ax.plot(xs, ys, lw=1.2, label=key)
      if dashed:
        xs, ys = health_curve(health, dashed)
        if xs:
          ax.plot(xs, ys, ls="--", color="tab:red", lw=1.2, label=dashed)
        if dashed == "q_bound" and xs:  # where the overestimation watch starts counting
          bounded = [r for r in health if r.get("q_bound") is not None]
          ax.plot(xs, [r["q_bound"] + overestimation_margin(r["q_bound"], r.get("q_floor"))
                       for r in bounded], ls=":", color="tab:red", lw=1.0, label="+ margin")
      if ax.lines:
        ax.legend(fontsize=6, loc="best")
      else:
        ax.text(0.5, 0.5, "not recorded", ha="center", va="center", transform=ax.transAxes,
                fontsize=8, color="gray")
      ax.set_title(title, fontsize=8)
  for ax in axes.ravel():
    ax.grid(alpha=0.3)
    ax.tick_params(labelsize=7)
  for ax in axes[-1]:
    ax.set_xlabel("env steps", fontsize=8)
  fig.tight_layout()
  if out is not None:
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
  return fig


def _short(group: str, n: int) -> str:
  parts = Path(group).parts[-3:]
  return "/".join(parts) + (f" ({n} seeds)" if n > 1 else "")


def main(argv: Sequence[str] | None = None) -> list[Path]:
  parser = argparse.ArgumentParser(prog="python -m jaxasync.plot", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("runs", nargs="+", help="run directories (each a --logdir)")
  parser.add_argument("--out", default=None, help="where the PNGs go (default: the first run)")
  parser.add_argument("--target", type=float, default=None, help="a dashed target return")
  parser.add_argument("--health", action="store_true",
                      help="also write health.png (plot_health: one column per run)")
  args = parser.parse_args(argv)
  written = plot_runs(args.runs, args.out, args.target)
  if args.health:
    path = Path(args.out if args.out is not None else args.runs[0]) / "health.png"
    _pyplot().close(plot_health(args.runs, path))
    written.append(path)
  for path in written:
    print(path)
  return written


if __name__ == "__main__":
  main()
