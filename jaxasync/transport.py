"""Bounded chunk transport from actors to the learner (border's ``ReplayBufferProxy``).

A ``Chunk`` is what an actor pushes: a batch of transitions tagged with the
actor id and the params version that produced them. The queue is bounded; when
it is full an actor either blocks (default: back-pressure, nothing lost) or the
oldest chunk is dropped and counted.

Actor threads share one ``queue.Queue``. Actor processes each write to a channel
of their own, a pipe the learner's process reads without blocking and frames
itself: an actor killed mid-write (``kill -9``, OOM) can leave only a torn frame
in its own pipe, which the learner discards when the pipe reports end-of-file
and which no other actor's data shares, and no lock, semaphore or counter is
shared between actors that a dead one could leave held. A restarted actor gets
a fresh channel (``open_channel``). (A shared ``multiprocessing.Queue`` failed
both ways under ``kill -9``: the learner blocked forever reading a torn message,
and semaphore slots leaked until every actor blocked in ``put``.)
"""

from __future__ import annotations

import collections
import fcntl
import multiprocessing as mp
import os
import pickle
import queue
import select
import threading
import time
from typing import Any, NamedTuple

_HEADER = 8  # bytes of a frame's length prefix (little-endian unsigned)
_READ_SIZE = 1 << 16  # per os.read; _read loops until the pipe is empty


class Chunk(NamedTuple):
  """What one actor pushes: its collector's items for ``env_steps`` env steps, with versions."""

  actor_id: int
  version: int  # oldest params version the chunk's steps were taken with (lag: upper bound)
  payload: Any  # the collector's output for these steps (transitions: leading batch axis)
  env_steps: int  # env steps taken to produce these transitions
  episode_returns: tuple[float, ...]  # returns of episodes that ended in them
  seq: int = 0  # the actor's chunk counter since its (re)start: gaps or repeats mean loss


class ChunkQueue:
  """A bounded queue of ``Chunk`` from actor threads (``process=False``) or processes.

  Threads ``put`` into one ``queue.Queue``. For processes, the actor supervisor calls
  ``open_channel(actor_id)`` before starting (or restarting) each actor and hands the
  returned ``ChunkChannel`` to it; the learner's ``get`` reads all channels.

  Bounds: ``maxsize`` chunks wait in the learner's process; with processes, each actor's pipe
  also holds about ``maxsize`` chunks (its buffer is sized to them on Linux) before that actor
  blocks.

  Args:
    maxsize: chunks held at most.
    drop_oldest: when full, drop the oldest chunk (counted in ``dropped``) instead
      of blocking the actor.
    process: actors are processes (spawn start method): one pipe per actor.
    ctx: the multiprocessing context of the actor processes (default: spawn).
    decode: processes: ``get`` returns each ``Chunk``; False: its pickled bytes, as the actor
      wrote them (for a reader that only forwards them: ``pickle.loads`` gives the chunk).
  """

  def __init__(self, maxsize: int = 64, drop_oldest: bool = False, process: bool = False, ctx=None,
               decode: bool = True):
    if maxsize < 1:
      raise ValueError(f"queue maxsize must be >= 1, got {maxsize}.")
    self.maxsize, self.drop_oldest, self.process = maxsize, drop_oldest, process
    self.decode = decode
    self._dropped = _Counter()
    if process:
      self._ctx = ctx or mp.get_context("spawn")
      self._chunks: collections.deque = collections.deque()
      self._readers: dict[int, _Reader] = {}
      self.discarded_bytes = 0  # torn frames of actors that died mid-write
    else:
      self._q = queue.Queue(maxsize)

  @property
  def dropped(self) -> int:
    return self._dropped.value

  def qsize(self) -> int:
    return len(self._chunks) if self.process else self._q.qsize()

  # --- the actors' side ------------------------------------------------------
  def open_channel(self, actor_id: int) -> "ChunkQueue | ChunkChannel":
    """What actor ``actor_id`` puts to: the queue itself for threads; for processes a fresh
    pipe whose write end the returned ``ChunkChannel`` carries into the actor's process.

    Complete chunks still in the actor's previous pipe are kept, a torn one is discarded.
    After starting the process, call the returned channel's ``close()`` in this process:
    the child's death must leave no writer, so that its pipe reads as end-of-file.
    """
    if not self.process:
      return self
    old = self._readers.pop(actor_id, None)
    if old is not None:
      self._read(old, final=True)
    reader, writer = self._ctx.Pipe(duplex=False)
    _size_pipe(reader.fileno(), 4096)
    os.set_blocking(reader.fileno(), False)
    self._readers[actor_id] = _Reader(actor_id, reader)
    return ChunkChannel(writer, self.drop_oldest)

  def put(self, chunk: Chunk, stop: threading.Event | Any, poll: float = 0.05) -> bool:
    """Pushes ``chunk`` from an actor thread; returns False if ``stop`` was set while waiting."""
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

  def release(self) -> None:
    """Called by an actor on exit (nothing to release for threads)."""

  # --- the learner's side ----------------------------------------------------
  def get(self, timeout: float | None = None) -> Chunk | None:
    """The next chunk, or None after ``timeout`` seconds (0: do not wait). Never blocks
    past ``timeout`` on a dead or stuck actor."""
    if not self.process:
      try:
        if timeout == 0:
          return self._q.get_nowait()
        return self._q.get(timeout=timeout)
      except queue.Empty:
        return None
    if len(self._chunks) < self.maxsize or self.drop_oldest:
      self.pump(0.0 if self._chunks else timeout)
    return self._chunks.popleft() if self._chunks else None

  def pump(self, timeout: float | None = 0.0) -> None:
    """Reads what actor processes have written (waiting up to ``timeout`` s for something)
    into the bounded buffer without taking a chunk: in drop-oldest mode actors then never
    block while the learner holds back; in blocking mode it reads only while there is room.
    For threads it only waits."""
    if not self.process:
      if timeout:
        time.sleep(timeout)
      return
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
      room = self.drop_oldest or len(self._chunks) < self.maxsize
      readers = list(self._readers.values()) if room else []
      left = None if deadline is None else max(0.0, deadline - time.monotonic())
      if not readers:
        if left:
          time.sleep(left)
        return
      try:
        ready, _, _ = select.select([r.fd for r in readers], [], [], left)
      except (OSError, ValueError):  # a reader closed under us (close() from another thread)
        return
      got = False
      for r in readers:
        if r.fd in ready:
          got |= self._read(r)
      if got or not left:
        return

  def _read(self, r: "_Reader", final: bool = False) -> bool:
    """Reads ``r``'s pipe until it would block; parses whole frames. ``final``: the writer is
    gone (a restart), so what is left is read and the pipe closed. Returns whether a chunk came."""
    got = False
    while True:
      try:
        data = os.read(r.fd, _READ_SIZE)
      except BlockingIOError:
        data = None
      except OSError:
        data = b""
      if data:
        r.buf += data
        got |= self._parse(r)
        continue
      if data == b"" or final:  # end-of-file: the writer exited or was killed
        self.discarded_bytes += len(r.buf)  # a torn frame, if any
        r.buf.clear()
        r.conn.close()
        if self._readers.get(r.actor_id) is r:
          del self._readers[r.actor_id]
      return got

  def _parse(self, r: "_Reader") -> bool:
    got = False
    buf = r.buf
    while len(buf) >= _HEADER:
      n = int.from_bytes(buf[:_HEADER], "little")
      if len(buf) < _HEADER + n:
        break
      frame = bytes(buf[_HEADER:_HEADER + n])
      chunk = pickle.loads(frame) if self.decode else frame
      del buf[:_HEADER + n]
      if not r.sized:
        _size_pipe(r.fd, self.maxsize * (_HEADER + n))
        r.sized = True
      self._chunks.append(chunk)
      got = True
      if self.drop_oldest and len(self._chunks) > self.maxsize:
        self._chunks.popleft()
        self._dropped.value += 1
    return got

  def close(self) -> None:
    """Closes every channel (the learner's end)."""
    if self.process:
      for r in list(self._readers.values()):
        r.conn.close()
      self._readers.clear()


class ChunkChannel:
  """An actor process's end of its own pipe to the learner (picklable until first used).

  ``put`` writes one length-prefixed frame; a full pipe blocks the actor (drop-oldest happens
  in the learner, which keeps reading) until ``stop`` is set.
  """

  def __init__(self, conn, drop_oldest: bool):
    self._conn, self.drop_oldest = conn, drop_oldest
    self._nonblocking = False

  def put(self, chunk: Chunk, stop: threading.Event | Any, poll: float = 0.05) -> bool:
    """Pushes ``chunk``; returns False if ``stop`` was set while the pipe was full."""
    fd = self._conn.fileno()
    if not self._nonblocking:
      os.set_blocking(fd, False)
      self._nonblocking = True
    data = pickle.dumps(chunk, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(len(data).to_bytes(_HEADER, "little") + data)
    while view:
      try:
        view = view[os.write(fd, view):]
        continue
      except BlockingIOError:
        pass
      if stop.is_set():  # a torn frame here is discarded by the learner at end-of-file
        return False
      select.select([], [fd], [], poll)
    return True

  def release(self) -> None:
    """Called by the actor on exit."""
    self._conn.close()

  def close(self) -> None:
    """Closes this process's copy of the write end (the supervisor, once the actor started)."""
    self._conn.close()


def _size_pipe(fd: int, nbytes: int) -> None:
  """Sets the pipe's kernel buffer to about ``nbytes`` (Linux rounds it up to a power-of-two
  number of pages; elsewhere nothing happens). A pipe opens at one page and is resized to
  ``maxsize`` frames once the actor's first frame shows how big its chunks are, so what waits
  between an actor and the learner stays bounded by ``maxsize`` chunks in the pipe plus
  ``maxsize`` in the learner's buffer. A default 64 KiB pipe holds many small chunks, whose
  data is stale by the time a rate-limited learner reads it; a one-page pipe makes the actor
  wait for the learner after every chunk (ARCHITECTURE.md has the figures)."""
  if hasattr(fcntl, "F_SETPIPE_SZ"):
    try:
      fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, max(4096, min(nbytes, 1 << 20)))
    except OSError:
      pass


class _Reader:
  __slots__ = ("actor_id", "conn", "fd", "buf", "sized")

  def __init__(self, actor_id: int, conn):
    self.actor_id, self.conn, self.fd, self.buf = actor_id, conn, conn.fileno(), bytearray()
    self.sized = False  # the pipe is resized to maxsize frames after the first frame


class _Counter:
  def __init__(self):
    self.value = 0
    self._lock = threading.Lock()

  def get_lock(self):
    return self._lock
