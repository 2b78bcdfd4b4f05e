"""Atari env throughput of each AtariEnvFactory backend, measured side by side in one run.

For every backend (gymnasium, ale_vector, envpool) the same preprocessed env (Pong by
default: frame skip 4 with max-pooling, 84x84 grayscale, stack of 4, sticky actions) is
stepped with uniformly random actions for --duration seconds after --warmup seconds, in
--repeats rounds with the backends interleaved (round 1 of every backend, then round 2,
...) so that drift in the machine's load hits them alike. Reported: medians of agent steps/s
and emulator frames/s (agent steps x frame_skip), and each backend's ratio to gymnasium's.
This is the env alone (no policy, no replay): the ceiling an actor can reach.

Run (from the repository root):
  python scripts/bench_atari.py                               # Pong, 8 envs, ~1 min
  python scripts/bench_atari.py --env-id ALE/Breakout-v5 --num-envs 16 --threads 2
  python scripts/bench_atari.py --json /tmp/atari.json --backends ale_vector envpool
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import sys
import time

import numpy as np
import tyro

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from jaxasync.atari import BACKENDS, AtariEnvFactory  # noqa: E402


@dataclasses.dataclass
class Args:
  env_id: str = "ALE/Pong-v5"
  backends: tuple[str, ...] = BACKENDS
  num_envs: int = 8
  """sub-envs per vector env."""
  threads: int = 0
  """worker threads of the C++ backends (0: min(num_envs, cores))."""
  duration: float = 5.0
  """measured seconds per backend per round."""
  warmup: float = 1.0
  repeats: int = 3
  seed: int = 0
  json: str | None = None
  """write the figures here as JSON."""


def measure(env, duration: float, warmup: float, rng: np.random.Generator) -> float:
  """Agent steps per second of ``env`` (all sub-envs) with random actions."""
  n = env.num_envs
  actions = env.single_action_space.n
  end_warmup = time.perf_counter() + warmup
  while time.perf_counter() < end_warmup:
    env.step(rng.integers(0, actions, size=n))
  steps, start = 0, time.perf_counter()
  while (now := time.perf_counter()) - start < duration:
    env.step(rng.integers(0, actions, size=n))
    steps += n
  return steps / (now - start)


def main(args: Args) -> dict:
  factories = {b: AtariEnvFactory(args.env_id, backend=b, num_threads=args.threads)
               for b in args.backends}
  envs = {b: f(args.num_envs, seed=args.seed) for b, f in factories.items()}
  rng = np.random.default_rng(args.seed)
  runs: dict[str, list[float]] = {b: [] for b in envs}
  try:
    for _ in range(args.repeats):
      for b, env in envs.items():
        runs[b].append(measure(env, args.duration, args.warmup, rng))
  finally:
    for env in envs.values():
      env.close()
  frame_skip = next(iter(factories.values())).frame_skip
  med = {b: statistics.median(r) for b, r in runs.items()}
  base = med.get("gymnasium")
  print(f"{args.env_id}, {args.num_envs} envs, threads={args.threads or 'auto'}, "
        f"{os.cpu_count()} cores, median of {args.repeats} x {args.duration:.0f} s")
  print(f"{'backend':<12}{'agent steps/s':>15}{'frames/s':>12}{'vs gymnasium':>15}")
  for b, v in med.items():
    ratio = f"{v / base:.2f}" if base else "-"
    print(f"{b:<12}{v:>15,.0f}{v * frame_skip:>12,.0f}{ratio:>15}")
  result = {
      "config": dataclasses.asdict(args) | {"cpu_count": os.cpu_count()},
      "agent_steps_per_sec": med,
      "frames_per_sec": {b: v * frame_skip for b, v in med.items()},
      "ratio_to_gymnasium": {b: v / base for b, v in med.items()} if base else {},
      "repeats": runs,
  }
  if args.json:
    with open(args.json, "w") as f:
      json.dump(result, f, indent=2)
  return result


if __name__ == "__main__":
  main(tyro.cli(Args))
