"""Bounded chunk transport from actors to the learner (border's ``ReplayBufferProxy``).

A ``Chunk`` is what an actor pushes: a batch of transitions tagged with the
actor id and the params version that produced them. The queue is bounded; when
it is full an actor either blocks (default: back-pressure, nothing lost) or drops
the oldest chunk and counts it.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import threading
from typing import Any, NamedTuple


class Chunk(NamedTuple):
  """Transitions from one actor. ``transitions`` has a leading batch axis."""

  actor_id: int
  version: int  # oldest params version the chunk's steps were taken with (lag: upper bound)
  transitions: Any
  env_steps: int  # env steps taken to produce these transitions
  episode_returns: tuple[float, ...]  # returns of episodes that ended in them
  seq: int = 0  # the actor's chunk counter since its (re)start: gaps or repeats mean loss


class ChunkQueue:
  """A bounded queue of ``Chunk`` for actor threads (``process=False``) or processes.

  Args:
    maxsize: chunks held at most.
    drop_oldest: when full, drop the oldest chunk (counted in ``dropped``) instead
      of blocking the actor.
    process: use a ``multiprocessing`` queue (spawn context) so that actor
      processes can push.
  """

  def __init__(self, maxsize: int = 64, drop_oldest: bool = False, process: bool = False, ctx=None):
    if maxsize < 1:
      raise ValueError(f"queue maxsize must be >= 1, got {maxsize}.")
    self.drop_oldest = drop_oldest
    if process:
      ctx = ctx or mp.get_context("spawn")
      self._q = ctx.Queue(maxsize)
      self._dropped = ctx.Value("q", 0)
    else:
      self._q = queue.Queue(maxsize)
      self._dropped = _Counter()

  @property
  def dropped(self) -> int:
    return self._dropped.value

  def qsize(self) -> int:
    try:
      return self._q.qsize()
    except NotImplementedError:  # macOS multiprocessing
      return -1

  def put(self, chunk: Chunk, stop: threading.Event | Any, poll: float = 0.05) -> bool:
    """Pushes ``chunk``; returns False if ``stop`` was set while waiting for room."""
    while not stop.is_set():
      try:
        self._q.put(chunk, timeout=poll)
        return True
      except queue.Full:
        if self.drop_oldest:
          try:
            self._q.get_nowait()
            with self._dropped.get_lock():
              self._dropped.value += 1
          except queue.Empty:
            pass
    return False

  def get(self, timeout: float | None = None) -> Chunk | None:
    """The next chunk, or None after ``timeout`` seconds (0: do not wait)."""
    try:
      if timeout == 0:
        return self._q.get_nowait()
      return self._q.get(timeout=timeout)
    except queue.Empty:
      return None

  def release(self) -> None:
    """Called by a process actor on exit: do not wait to flush chunks nobody will read."""
    if hasattr(self._q, "cancel_join_thread"):
      self._q.cancel_join_thread()

  def close(self) -> None:
    if hasattr(self._q, "close"):
      self._q.close()
      self._q.join_thread()


class _Counter:
  def __init__(self):
    self.value = 0
    self._lock = threading.Lock()

  def get_lock(self):
    return self._lock
