"""What a checkpoint's replay costs to save and to load: a frame replay (Atari's layout: 84x84
frames, stacks of 4, each frame stored once) filled to capacity, written with the checkpoint
format (one .npy per array + state.json) and read back (memory-mapped, then copied into a
fresh replay), timed, with the bytes on disk.

  python scripts/bench_checkpoint.py                       # 1M transitions (~7 GB; needs ~22 GB RAM)
  python scripts/bench_checkpoint.py --capacity 100000     # a quicker look

The fill is synthetic (random frames, episodes of 500 steps); what is timed is only the copy
(``state_dict``: what the learner waits for), the write and the load.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import tyro

from jaxasync.checkpoint import read_tree_dir, write_tree_dir
from jaxasync.collectors.frames import FrameStepProcessor
from jaxasync.replay.frames import FrameReplayBuffer
from jaxasync.types import Transition


@dataclasses.dataclass
class Args:
  capacity: int = 1_000_000
  """transitions the replay holds."""
  num_envs: int = 8
  dir: str | None = None
  """where to write (default: a temporary directory, removed after)."""


def filled(capacity: int, num_envs: int) -> FrameReplayBuffer:
  obs = np.zeros((84, 84, 4), np.uint8)
  example = Transition(obs=obs, action=np.zeros((), np.int64), reward=np.zeros((), np.float32),
                       discount=np.zeros((), np.float32), next_obs=obs)
  replay = FrameReplayBuffer(example, capacity, seed=0)
  proc = FrameStepProcessor(num_envs, obs, np.zeros((), np.int64), 3, 0.99)
  rng = np.random.default_rng(0)
  stack = rng.integers(0, 255, (num_envs, 84, 84, 4), np.uint8)
  proc.reset(stack)
  t, chunk = 0, []
  while replay.added_total < capacity + num_envs:
    frame = rng.integers(0, 255, (num_envs, 84, 84, 1), np.uint8)
    stack = np.concatenate([stack[..., 1:], frame], axis=-1)
    done = np.full(num_envs, (t + 1) % 500 == 0)
    chunk.append(proc.step(np.zeros(num_envs, np.int64), np.ones(num_envs), stack, done,
                           np.zeros(num_envs, bool)))
    t += 1
    if len(chunk) == 16:
      import jax
      replay.add(jax.tree.map(lambda *xs: np.concatenate(xs), *chunk))
      chunk = []
  return replay


def main(args: Args) -> None:
  t0 = time.perf_counter()
  replay = filled(args.capacity, args.num_envs)
  print(f"filled {len(replay):,} transitions ({replay.nbytes / 2**30:.2f} GiB in memory) in "
        f"{time.perf_counter() - t0:.0f} s", flush=True)
  root = Path(args.dir or tempfile.mkdtemp(prefix="jaxasync-ckpt-"))
  try:
    t0 = time.perf_counter()
    state = replay.state_dict()
    t_copy = time.perf_counter() - t0
    t0 = time.perf_counter()
    write_tree_dir(root / "replay", state)
    t_write = time.perf_counter() - t0
    size = sum(p.stat().st_size for p in (root / "replay").rglob("*") if p.is_file())
    del state
    del replay  # (room for the loaded copy: a 1M replay is ~7 GB)
    t0 = time.perf_counter()
    loaded = read_tree_dir(root / "replay")
    other = FrameReplayBuffer(replay_example(), args.capacity, seed=1)
    other.load_state_dict(loaded)
    t_load = time.perf_counter() - t0
    print(f"copy (state_dict) {t_copy:.1f} s | write {t_write:.1f} s "
          f"({size / 2**30 / max(t_write, 1e-9):.2f} GiB/s) | load {t_load:.1f} s | "
          f"{size / 2**30:.2f} GiB on disk, {size / len(other):,.0f} bytes per transition")
  finally:
    if args.dir is None:
      shutil.rmtree(root, ignore_errors=True)


def replay_example() -> Transition:
  obs = np.zeros((84, 84, 4), np.uint8)
  return Transition(obs=obs, action=np.zeros((), np.int64), reward=np.zeros((), np.float32),
                    discount=np.zeros((), np.float32), next_obs=obs)


if __name__ == "__main__":
  main(tyro.cli(Args))
