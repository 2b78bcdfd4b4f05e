"""Frame-deduplicated replay for stacked-frame observations (Atari): each frame stored once.

A plain ``ReplayBuffer`` of Atari transitions holds ``obs`` and ``next_obs``, two
``84x84x4`` stacks, per transition: 8 copies of every frame. Here every frame is
stored once, in the record of the env step that produced it, and stacks and n-step
returns are rebuilt from records:

* ``FrameStepProcessor`` (``jaxasync.collectors.frames``, the replay's
  ``step_processor_cls``) turns vector-env steps into ``FrameRecords``: one record per
  observed frame, tagged with a stream id (one per sub-env, unique across actors) and a
  per-stream sequence number.
* ``FrameReplayBuffer.add`` links each record to its predecessor in its stream,
  records which ``K`` records make up its stack, and completes the n-step
  transitions that the new records close (return, discount, bootstrap record), with
  ``collectors.returns.n_step_returns``, as ``StepProcessor`` does.
* ``sample`` returns ``Transition`` batches equal to what ``StepProcessor`` +
  ``ReplayBuffer`` would have stored for the same steps.

Records of one episode of one sub-env (``K`` frames per stack, ``T`` steps)::

    PAD_1 .. PAD_{K-1}  STEP_0  STEP_1 ... STEP_{T-1}  FINAL_T
    \\__ older frames of the reset stack __/   \\__ newest frame of obs_T, kind TERMINATED
                                                      or TRUNCATED, never a start

``STEP_t`` holds the newest frame of ``obs_t`` with the action taken at ``obs_t`` and
the reward that followed; the stack of ``obs_t`` is the ``K`` records ending at
``STEP_t``. Storing the reset stack's older frames as ``PAD`` records reproduces any
padding (``FrameStackObservation``'s repeated reset frame, ale-py's zero frames)
exactly, at ``K - 1`` extra records per episode.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# (The collector's names stay importable from here, TRUNCATED included: the replay and its
# collector are a pair.)
from jaxasync.collectors.frames import (PAD, STEP, TERMINATED, TRUNCATED, FrameRecords,
                                        FrameStepProcessor)
from jaxasync.collectors.returns import n_step_returns
from jaxasync.replay.prioritized import PrioritizedReplayBuffer
from jaxasync.replay.uniform import ReplayBuffer, check_saved_prefix, restore_prefix
from jaxasync.types import Transition

PyTree = Any

# Position markers (real positions are >= 0).
_BROKEN = -1  # the predecessor is unknown (a dropped chunk) or overwritten
_START = -2  # before the first record of an episode
# What a never-written slot holds in each array ``_arrays`` names (0 / False where absent):
# ``load_state_dict`` blanks the slots a checkpoint does not hold with these.
_BLANK = {"pos": _BROKEN, "prev": _BROKEN, "stack": _BROKEN, "boot": _BROKEN, "dep": _BROKEN}


class FrameReplayBuffer(ReplayBuffer):
  """Uniform replay of n-step transitions over stacked frames, each frame stored once.

  Storage is a ring of ``capacity`` records (see the module docstring), each holding
  one frame, its action, reward and kind, and, as int64 positions (the record's index
  in the stream of all records ever added; slot = position mod capacity):
  ``stack`` (the ``K`` records of its observation), ``boot`` (the record whose stack
  is ``next_obs``) and ``dep`` (the start whose stack begins here). A ``STEP`` record
  becomes a live transition, with its return and discount, once its n-step window
  is complete, and stops being live as soon as the oldest record of its stack is
  overwritten: every other record it uses is newer, so nothing it needs is ever
  missing. ``len`` is the number of live transitions; ``sample`` draws among them.

  n-step returns and discounts are computed once, when the transition completes, by the
  function ``StepProcessor`` uses (``n_step_returns``): ``terminated`` gives discount 0,
  ``truncated`` bootstraps from the final observation, no transition crosses an
  episode end, and a gap in a stream (a dropped chunk) only makes the transitions
  that would span it unavailable.

  Memory per record: one frame, the action, and ``50 + 8 K`` bytes of bookkeeping (for
  84x84 frames, ``K = 4`` and int64 actions, 7146 bytes: 0.253x one 84x84x4 stack,
  where a plain ``ReplayBuffer`` needs 2 stacks + 16 bytes). A transition costs one
  record, plus ``K`` records per episode (the pads and the final frame).

  Concurrency: not thread-safe; the learner thread owns it, as ``ReplayBuffer``.

  Args:
    example: one ``Transition`` (no batch axis); ``example.obs`` is a stack
      ``[*frame_shape, K]`` giving frame shape, ``K`` and dtype, ``example.action``
      the action shape and dtype.
    capacity: records kept; the oldest are overwritten first.
    seed: seed of the sampling generator.
  """

  step_processor_cls = FrameStepProcessor

  def __init__(self, example: Transition, capacity: int, seed: int = 0):
    # ReplayBuffer.__init__ is not called: it would allocate a stack-per-leaf layout.
    if capacity < 1:
      raise ValueError(f"replay capacity must be >= 1, got {capacity}; pass a positive capacity.")
    obs, action = np.asarray(example.obs), np.asarray(example.action)
    if obs.ndim < 1:
      raise ValueError("FrameReplayBuffer needs stacked observations [*frame_shape, K].")
    self._k = obs.shape[-1]
    self._obs_shape, self._frame_shape, self._obs_dtype = obs.shape, obs.shape[:-1], obs.dtype
    self._action_shape, self._action_dtype = action.shape, action.dtype
    c = self._capacity = capacity
    self._frames = np.zeros((c,) + self._frame_shape, obs.dtype)
    self._action = np.zeros((c,) + action.shape, action.dtype)
    self._reward = np.zeros(c, np.float64)
    self._kind = np.zeros(c, np.int8)
    self._pos = np.full(c, _BROKEN, np.int64)  # position of the record in each slot
    self._prev = np.full(c, _BROKEN, np.int64)  # position of its predecessor in its stream
    self._stack = np.full((c, self._k), _BROKEN, np.int64)
    self._boot = np.full(c, _BROKEN, np.int64)
    self._ret = np.zeros(c, np.float32)
    self._disc = np.zeros(c, np.float32)
    self._dep = np.full(c, _BROKEN, np.int64)
    self._live = np.zeros(c, bool)
    self._streams: dict[int, tuple[int, int]] = {}  # stream -> (last seq, last position)
    self._n: int | None = None
    self._gamma: float | None = None
    self._size = 0  # live transitions
    self._added_total = 0  # records ever added: the next record's position
    self._rng = np.random.default_rng(seed)

  # --- introspection -------------------------------------------------------
  @property
  def nbytes(self) -> int:
    return sum(x.nbytes for x in self._arrays().values())

  def max_items(self, env_steps: int) -> int:
    """The most records ``env_steps`` env steps can add: ``K + 1`` each, since an episode of
    ``T`` steps is ``T + K`` records (``K - 1`` pads and the final frame)."""
    return env_steps * (self._k + 1)

  @property
  def n_step(self) -> int | None:
    """The n of the stored transitions (adopted from the first chunk; ``None`` before)."""
    return self._n

  @property
  def gamma(self) -> float | None:
    return self._gamma

  @property
  def live(self) -> np.ndarray:
    """Which slots hold a sampleable transition, ``[capacity]`` bool (read-only view)."""
    view = self._live.view()
    view.flags.writeable = False
    return view

  def _arrays(self) -> dict[str, np.ndarray]:
    return {"frames": self._frames, "action": self._action, "reward": self._reward,
            "kind": self._kind, "pos": self._pos, "prev": self._prev, "stack": self._stack,
            "boot": self._boot, "ret": self._ret, "disc": self._disc, "dep": self._dep,
            "live": self._live}

  # --- writing -------------------------------------------------------------
  def _check_records(self, chunk) -> FrameRecords:
    if not isinstance(chunk, FrameRecords):
      raise ValueError(
          f"{type(self).__name__}.add takes FrameRecords from FrameStepProcessor, got "
          f"{type(chunk).__name__}; build the step processor from replay.step_processor_cls.")
    chunk = FrameRecords(*(np.asarray(x) for x in chunk))
    n = chunk.kind.shape[0]
    if chunk.frame.shape != (n,) + self._frame_shape or chunk.frame.dtype != self._obs_dtype:
      raise ValueError(f"records have frames {chunk.frame.shape} {chunk.frame.dtype}, expected "
                       f"{(n,) + self._frame_shape} {self._obs_dtype}.")
    if chunk.action.shape != (n,) + self._action_shape or chunk.action.dtype != self._action_dtype:
      raise ValueError(f"records have actions {chunk.action.shape} {chunk.action.dtype}, "
                       f"expected {(n,) + self._action_shape} {self._action_dtype}.")
    if n:
      n_step, gamma = int(chunk.n_step[0]), float(chunk.gamma[0])
      if self._n is None:
        self._n, self._gamma = n_step, gamma
      if (np.any(chunk.n_step != self._n) or np.any(chunk.gamma != self._gamma)):
        raise ValueError(
            f"records made with n_step={n_step}, gamma={gamma} but this replay holds "
            f"n_step={self._n}, gamma={self._gamma}; every processor must use the same ones.")
    return chunk

  def _invalidated(self, slots: np.ndarray) -> None:
    """Called with the slots whose live transitions were just dropped (for subclasses)."""

  def _kill(self, slots: np.ndarray) -> None:
    slots = np.unique(slots)
    slots = slots[self._live[slots]]
    if slots.size:
      self._live[slots] = False
      self._size -= slots.size
      self._invalidated(slots)

  def _alive(self, p: np.ndarray) -> np.ndarray:
    """Whether positions ``p`` still hold their record."""
    return (p >= 0) & (self._pos[p % self._capacity] == p)

  def _hop(self, p: np.ndarray) -> np.ndarray:
    """The predecessors of positions ``p``; markers stay markers, lost records become BROKEN."""
    c = self._capacity
    return np.where(p < 0, p, np.where(self._alive(p), self._prev[p % c], _BROKEN))

  def add(self, chunk: FrameRecords) -> np.ndarray:
    """Adds records; returns the slots of the transitions they completed, ``[m]`` int64.

    ``ReplayBuffer.add`` returns the slots written; here a slot becomes sampleable
    only when its n-step window is complete, so the newly live slots are returned
    (each once), which is what ``PrioritizedReplayBuffer.add`` gives max priority.
    """
    chunk = self._check_records(chunk)
    n = chunk.kind.shape[0]
    done = [np.zeros(0, np.int64)]
    for start in range(0, n, self._capacity):  # pieces never overwrite their own records
      piece = FrameRecords(*(x[start:start + self._capacity] for x in chunk))
      done.append(self._add_piece(piece))
    return np.concatenate(done)

  def _add_piece(self, rec: FrameRecords) -> np.ndarray:
    """Adds at most ``capacity`` records (so none overwrites another); returns the slots of
    the transitions they make live."""
    pos = self._added_total + np.arange(rec.kind.shape[0], dtype=np.int64)
    slots = pos % self._capacity
    self._drop_overwritten(slots)
    prev = self._predecessors(rec, pos)
    self._write(rec, pos, slots, prev)
    self._stack[slots] = self._stacks_ending_at(pos)
    starts = self._complete_windows(rec, pos)
    if not starts.size:
      return np.zeros(0, np.int64)
    live = self._make_live(starts)
    if len(self._streams) > 4096:  # forget streams whose last record is gone
      lo = self._added_total - self._capacity
      self._streams = {s: v for s, v in self._streams.items() if v[1] >= lo}
    return live

  def _drop_overwritten(self, slots: np.ndarray) -> None:
    """Drops the transitions that start at the records about to be overwritten, and the
    ones whose stack begins there (every other record a transition uses is newer)."""
    c = self._capacity
    old = self._pos[slots] >= 0
    if not old.any():
      return
    old_slots = slots[old]
    dep = self._dep[old_slots]
    has = dep >= 0
    dep_slots = dep[has] % c
    # (only if the dependent still is that start and its stack still begins here)
    same = (self._pos[dep_slots] == dep[has]) & (
        self._stack[dep_slots, 0] == self._pos[old_slots][has])
    self._kill(np.concatenate([old_slots, dep_slots[same]]))

  def _predecessors(self, rec: FrameRecords, pos: np.ndarray) -> np.ndarray:
    """The position of each new record's predecessor in its stream, in this piece or
    earlier, ``[N]``: ``_START`` for an episode's first record, ``_BROKEN`` after a gap.
    Updates each stream's last (seq, position)."""
    n = pos.shape[0]
    order = np.lexsort((rec.seq, rec.stream))  # by stream, then seq (stable)
    s_stream, s_seq = rec.stream[order], rec.seq[order]
    prev = np.full(n, _BROKEN, np.int64)
    if n:
      same_stream = np.zeros(n, bool)
      same_stream[1:] = s_stream[1:] == s_stream[:-1]
      chained = same_stream.copy()
      chained[1:] &= s_seq[1:] == s_seq[:-1] + 1
      prev_sorted = np.where(chained, np.concatenate([[_BROKEN], pos[order][:-1]]), _BROKEN)
      heads = np.nonzero(~same_stream)[0]
      ends = np.concatenate([heads[1:], [n]]) - 1
      for h, e in zip(heads.tolist(), ends.tolist()):
        stream = int(s_stream[h])
        last = self._streams.get(stream)
        if last is not None and last[0] == s_seq[h] - 1:
          prev_sorted[h] = last[1]
        self._streams[stream] = (int(s_seq[e]), int(pos[order[e]]))
      prev[order] = prev_sorted
    return np.where(rec.first, _START, prev)

  def _write(self, rec: FrameRecords, pos: np.ndarray, slots: np.ndarray,
             prev: np.ndarray) -> None:
    """Stores the records at ``slots`` (their transitions not yet live)."""
    self._frames[slots] = rec.frame
    self._action[slots] = rec.action
    self._reward[slots] = rec.reward
    self._kind[slots] = rec.kind
    self._pos[slots] = pos
    self._prev[slots] = prev
    self._dep[slots] = _BROKEN
    self._live[slots] = False  # (already dropped by _drop_overwritten)
    self._added_total += pos.shape[0]

  def _stacks_ending_at(self, pos: np.ndarray) -> np.ndarray:
    """The positions of the ``K`` records ending at each of ``pos``, oldest first,
    ``[N, K]`` (markers where there are none)."""
    k = self._k
    stack = np.empty((pos.shape[0], k), np.int64)
    stack[:, k - 1] = pos
    for j in range(k - 2, -1, -1):
      stack[:, j] = self._hop(stack[:, j + 1])
    return stack

  def _walk_back(self, w_pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """From records ``w_pos`` ``[W]``, the positions ``1 .. n`` records back, ``[n, W]``, and
    whether each is a stored ``STEP`` record of the same episode (once not, never again)."""
    c, n = self._capacity, self._n
    back = np.empty((n, w_pos.shape[0]), np.int64)
    active = np.empty((n, w_pos.shape[0]), bool)
    cur, act = w_pos, np.ones(w_pos.shape[0], bool)
    for j in range(n):
      cur = self._hop(cur)
      act = act & self._alive(cur) & (self._kind[cur % c] == STEP)
      back[j], active[j] = cur, act
    return back, active

  def _complete_windows(self, rec: FrameRecords, pos: np.ndarray) -> np.ndarray:
    """The n-step transitions the new records complete: each new non-PAD record closes the
    window of the ``STEP`` record ``n`` back, or, if it ends the episode, of every ``STEP``
    record of the episode up to ``n`` back. Sets their return, discount and bootstrap
    record; returns their start positions, ordered by steps back, then by record."""
    c = self._capacity
    walkers = np.nonzero(rec.kind != PAD)[0]
    w_pos, w_kind = pos[walkers], rec.kind[walkers]
    back, active = self._walk_back(w_pos)
    # Row j of ``back`` is the start j + 1 steps back: in time order (oldest first, as
    # n_step_returns takes them) the rows run the other way.
    r_t = np.where(active, self._reward[back % c], 0.0)[::-1]
    g_t, discount_t = n_step_returns(r_t, w_kind == TERMINATED, self._gamma)
    full = (np.arange(1, self._n + 1) == self._n)[:, None]
    js, ws = np.nonzero(active & ((w_kind != STEP) | full))
    starts = back[js, ws]
    start_slots = starts % c
    self._ret[start_slots] = g_t[::-1][js, ws].astype(np.float32)
    self._disc[start_slots] = discount_t[::-1][js, ws].astype(np.float32)
    self._boot[start_slots] = w_pos[ws]
    return starts

  def _make_live(self, starts: np.ndarray) -> np.ndarray:
    """Makes the completed transitions at ``starts`` live where their whole stack is still
    stored; returns their slots."""
    c = self._capacity
    start_slots = starts % c
    oldest = self._stack[start_slots, 0]
    ok = oldest >= max(0, self._added_total - c)  # whole stack stored (markers are < 0)
    start_slots = start_slots[ok]
    self._live[start_slots] = True
    self._dep[oldest[ok] % c] = starts[ok]
    self._size += start_slots.size
    return start_slots

  # --- reading -------------------------------------------------------------
  def sample_indices(self, batch_size: int) -> np.ndarray:
    """Live slots drawn uniformly with replacement, ``[batch_size]`` int64."""
    self._check_sample_size(batch_size)
    filled = self.filled
    # Rejection sampling over the filled slots: almost all are live in a warm buffer.
    got, need = [], batch_size
    for _ in range(4):
      cand = self._rng.integers(0, filled, size=2 * need + 8)
      cand = cand[self._live[cand]][:need]
      got.append(cand)
      need -= cand.size
      if need == 0:
        return np.concatenate(got)
    live = np.flatnonzero(self._live)  # (a mostly empty buffer)
    got.append(live[self._rng.integers(0, live.size, size=need)])
    return np.concatenate(got)

  def gather(self, indices: np.ndarray) -> Transition:
    """Transitions at live slots ``indices`` as a ``Transition`` with leading axes ``indices.shape``."""
    indices = np.asarray(indices)
    flat = indices.reshape(-1)
    c = self._capacity
    boot_slots = self._boot[flat] % c

    def stacks(slots):
      # Frame by frame into the stack-last layout: 3x faster than gathering [B, K, ...]
      # and transposing (numpy transposes byte-strided data slowly).
      positions = self._stack[slots] % c  # [B, K]
      out = np.empty((flat.size,) + self._obs_shape, self._obs_dtype)
      for j in range(self._k):
        out[..., j] = self._frames[positions[:, j]]
      return out.reshape(indices.shape + self._obs_shape)

    return Transition(
        obs=stacks(flat),
        action=self._action[flat].reshape(indices.shape + self._action_shape),
        reward=self._ret[flat].reshape(indices.shape),
        discount=self._disc[flat].reshape(indices.shape),
        next_obs=stacks(boot_slots))

  def returns_and_discounts(self) -> tuple[np.ndarray, np.ndarray]:
    """The live transitions' n-step returns and bootstrap discounts, ``([N], [N])`` float32
    (``N = len(self)``; copies): what ``gather`` returns as ``reward`` and ``discount``
    (computed once per transition when its window completed: discount 0 if it terminated)."""
    return self._ret[self._live], self._disc[self._live]

  # --- checkpointing -------------------------------------------------------
  def state_dict(self) -> dict:
    """A copy of the state; each array holds the ``filled`` slots only, ``[filled, ...]``
    (records are written from slot 0 on, so the rest hold nothing)."""
    n = self.filled
    return {**{k: v[:n].copy() for k, v in self._arrays().items()},
            "capacity": self._capacity, "streams": dict(self._streams), "n_step": self._n,
            "gamma": self._gamma, "size": self._size, "added_total": self._added_total,
            "rng": self._rng.bit_generator.state}

  def load_state_dict(self, state: dict) -> None:
    """Puts back a ``state_dict`` (or one with full-ring arrays ``[capacity, ...]``, as
    checkpoints held before they were trimmed to ``filled``)."""
    arrays = self._arrays()
    saved = {name: np.asarray(state[name]) for name in arrays}
    filled = self._saved_filled(state, saved["frames"])
    for name, store in arrays.items():
      check_saved_prefix(repr(name), saved[name], store, filled)
    for name, store in arrays.items():
      restore_prefix(store, saved[name], _BLANK.get(name, 0))
    self._streams = dict(state["streams"])
    self._n, self._gamma = state["n_step"], state["gamma"]
    self._size, self._added_total = int(state["size"]), int(state["added_total"])
    self._rng.bit_generator.state = state["rng"]


class PrioritizedFrameReplayBuffer(PrioritizedReplayBuffer, FrameReplayBuffer):
  """``FrameReplayBuffer`` storage with ``PrioritizedReplayBuffer`` sampling.

  Nothing is reimplemented: through the MRO (this class, ``PrioritizedReplayBuffer``,
  ``FrameReplayBuffer``, ``ReplayBuffer``) the prioritized buffer's ``add`` gives the
  slots that ``FrameReplayBuffer.add`` reports newly live the max priority and a new
  generation, and its ``sample`` / ``update_priorities`` run unchanged over those. A
  transition that stops being live gets priority 0 (never drawn again) and a new
  generation, so a priority computed from it before it was dropped is ignored.

  Args:
    example, capacity, seed: as ``FrameReplayBuffer``.
    alpha, beta, eps: as ``PrioritizedReplayBuffer``.
  """

  def __init__(self, example: Transition, capacity: int, seed: int = 0,
               alpha: float = 0.6, beta: float = 0.4, eps: float = 1e-6):
    super().__init__(example, capacity, seed, alpha=alpha, beta=beta, eps=eps)

  def _invalidated(self, slots: np.ndarray) -> None:
    self._tree.update(slots, 0.0)
    self._generation[slots] += 1

  @property
  def nbytes(self) -> int:
    # The sum tree's float64 nodes and the generations count too.
    tree = getattr(self._tree, "_nodes", np.zeros(2 * self._capacity))
    return FrameReplayBuffer.nbytes.fget(self) + self._generation.nbytes + tree.nbytes
