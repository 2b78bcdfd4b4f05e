"""Shared test fixtures: a Box(4) space, random replay-like batches, the experiment scripts."""

import importlib.util
import multiprocessing as mp
import os
import signal
import sys
import threading
import time

import gymnasium as gym
import jax
import numpy as np

from jaxasync import Transition

def load_script(path, name: str):
  """The module of the script at ``path`` (scripts/ is not a package), registered in
  ``sys.modules`` as ``name`` once (dataclass annotations are resolved through it)."""
  if name not in sys.modules:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
  return sys.modules[name]


BOX4 = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)


def random_batch(rng, shape, num_actions=2):
  """A batch with leading axes ``shape`` (e.g. ``(B,)`` or ``(k, B)``), replay dtypes."""
  return Transition(
      obs=rng.normal(size=shape + (4,)).astype(np.float32),
      action=rng.integers(0, num_actions, size=shape).astype(np.int64),
      reward=rng.normal(size=shape).astype(np.float32),
      discount=rng.choice([0.0, 0.99], size=shape).astype(np.float32),
      next_obs=rng.normal(size=shape + (4,)).astype(np.float32),
  )


def host(tree):
  """A host copy (the jitted update donates its input state)."""
  return jax.tree.map(np.array, jax.device_get(tree))


def rainbow_module():
  """experiments/rainbow.py (experiments/ is on pytest's pythonpath)."""
  import rainbow
  return rainbow


def assert_no_strays(before: set) -> None:
  """Within 5 s, no thread beyond the idents in ``before`` and no child process is left."""
  deadline = time.monotonic() + 5
  while time.monotonic() < deadline:
    extra = [t for t in threading.enumerate() if t.ident not in before and t.is_alive()]
    if not extra and not mp.active_children():
      return
    time.sleep(0.05)
  raise AssertionError(f"stray threads {extra} or processes {mp.active_children()}")


def mapped_semaphores(pid: int) -> set[int]:
  """The named semaphores process ``pid`` has open, by inode: ``sem_open`` maps each one, and
  /proc/<pid>/maps names it by the temporary file glibc made it in (shown as deleted), so the
  inode, not the name, identifies it."""
  with open(f"/proc/{pid}/maps") as f:
    return {int(line.split()[4]) for line in f if "/dev/shm/sem." in line}


def _group_semaphores(pgid: int) -> set[int]:
  """``mapped_semaphores`` of every process of group ``pgid``."""
  inodes = set()
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open(f"/proc/{pid}/stat") as f:
        if int(f.read().rsplit(")", 1)[1].split()[2]) != pgid:  # (field 5: the group)
          continue
      inodes |= mapped_semaphores(int(pid))
    except (OSError, ValueError, IndexError):  # (gone meanwhile)
      continue
  return inodes


def kill_group(pgid: int) -> int:
  """SIGKILL to process group ``pgid`` (a crash), then unlinks the named semaphores its
  processes held, which a killed group leaves in /dev/shm for good: only finalizers, or the
  group's own resource tracker (killed with it), unlink them. The group is stopped while they
  are listed, so none is made unseen. Returns how many it unlinked (0 without Linux's /proc)."""
  if not os.path.isdir("/proc/self"):
    os.killpg(pgid, signal.SIGKILL)
    return 0
  os.killpg(pgid, signal.SIGSTOP)
  inodes = _group_semaphores(pgid)
  os.killpg(pgid, signal.SIGKILL)
  unlinked = 0
  for name in os.listdir("/dev/shm") if inodes else ():
    path = os.path.join("/dev/shm", name)
    try:
      if name.startswith("sem.") and os.stat(path).st_ino in inodes:
        os.unlink(path)
        unlinked += 1
    except FileNotFoundError:  # (unlinked meanwhile)
      continue
  return unlinked
