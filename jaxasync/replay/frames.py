"""Frame-deduplicated replay for stacked-frame observations (Atari): each frame stored once.

A plain ``ReplayBuffer`` of Atari transitions holds ``obs`` and ``next_obs``, two
``84x84x4`` stacks, per transition: 8 copies of every frame. Here every frame is
stored once, in the record of the env step that produced it, and stacks and n-step
returns are rebuilt from records:

* ``FrameStepProcessor`` (the replay's ``step_processor_cls``) turns vector-env steps
  into ``FrameRecords``: one record per observed frame, tagged with a stream id (one
  per sub-env, unique across actors) and a per-stream sequence number.
* ``FrameReplayBuffer.add`` links each record to its predecessor in its stream,
  records which ``K`` records make up its stack, and completes the n-step
  transitions that the new records close (return, discount, bootstrap record).
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

import secrets
from typing import Any, NamedTuple

import numpy as np

from jaxasync.replay.prioritized import PrioritizedReplayBuffer
from jaxasync.replay.uniform import ReplayBuffer
from jaxasync.step_processor import ProcessorBase
from jaxasync.types import Transition

PyTree = Any

# Record kinds.
PAD, STEP, TERMINATED, TRUNCATED = 0, 1, 2, 3
# Position markers (real positions are >= 0).
_BROKEN = -1  # the predecessor is unknown (a dropped chunk) or overwritten
_START = -2  # before the first record of an episode


class FrameRecords(NamedTuple):
  """What ``FrameStepProcessor.step`` emits and ``FrameReplayBuffer.add`` takes: ``N`` records.

  Every field has leading axis ``[N]``. Records of one stream appear in ``seq`` order;
  records of different streams may interleave freely (several sub-envs, several actors).

  Attributes:
    frame: the frame this record adds, ``[N, *frame_shape]`` (the observation dtype).
    action: for ``STEP`` records the action taken at this observation, else zeros,
      ``[N, *action_shape]``.
    reward: for ``STEP`` records the reward of that action, else 0, ``[N]`` float64.
    kind: ``PAD``, ``STEP``, ``TERMINATED`` or ``TRUNCATED``, ``[N]`` int8.
    first: the first record of an episode, ``[N]`` bool.
    stream: the sub-env's stream id, unique across processors, ``[N]`` int64.
    seq: the record's index in its stream (consecutive across episodes), ``[N]`` int64.
    n_step, gamma: the processor's settings, ``[N]`` int32 / float64: the buffer adopts
      them from its first chunk and refuses chunks with other ones.
  """

  frame: np.ndarray
  action: np.ndarray
  reward: np.ndarray
  kind: np.ndarray
  first: np.ndarray
  stream: np.ndarray
  seq: np.ndarray
  n_step: np.ndarray
  gamma: np.ndarray


def _shifted_by_one(new: np.ndarray, old: np.ndarray) -> bool:
  """Whether ``new[..., :-1] == old[..., 1:]`` (stacks ``[..., K]``, newest frame last)."""
  k, size = new.shape[-1], new.dtype.itemsize
  word = k * size
  if word in (2, 4, 8) and new.flags.c_contiguous and old.flags.c_contiguous:
    # One little-endian word per pixel holds its K values, frame j at bits 8 j size: the
    # shift is a bit shift, compared on contiguous words (~10x faster than strided views).
    u = np.dtype(f"<u{word}")
    mask = np.array((1 << (8 * (word - size))) - 1, u)
    return np.array_equal(new.view(u) & mask, old.view(u) >> np.array(8 * size, u))
  return np.array_equal(new[..., :-1], old[..., 1:])


class FrameStepProcessor(ProcessorBase):
  """Turns steps of a NEXT_STEP vector env with frame-stacked observations into ``FrameRecords``.

  Same constructor and methods as ``StepProcessor``; ``step`` returns records, not
  transitions (``FrameReplayBuffer`` builds the transitions). Observations are stacks
  ``[*frame_shape, K]`` with the newest frame last, as ``AtariEnvFactory`` makes them.

  Each sub-env is a stream whose id is a random 47-bit number drawn from the OS at
  construction, shifted left 16 bits, plus the sub-env index: actors (and restarted
  actors) never share ids, whatever their seeds.

  Args:
    num_envs: sub-envs in the vector env (< 65536).
    obs_example: one observation, ``[*frame_shape, K]``.
    action_example: one action, giving shape and dtype.
    n_step, gamma: see ``ProcessorBase``; used by the buffer.
    reward_clip: see ``ProcessorBase``: records carry clipped rewards, so the buffer's
      n-step returns sum clipped rewards, as ``StepProcessor``'s do.
    check_stacks: verify at every step that each observation is the previous one
      shifted by one frame (``next_obs[..., :-1] == obs[..., 1:]``), the property the
      buffer relies on; raises ``ValueError`` otherwise. Costs one comparison of the
      observations (tens of microseconds for 8 Atari sub-envs).
  """

  def __init__(self, num_envs: int, obs_example: np.ndarray, action_example: np.ndarray,
               n_step: int = 1, gamma: float = 0.99, reward_clip: float = 0.0, *,
               check_stacks: bool = True):
    if not 1 <= num_envs < 2 ** 16:
      raise ValueError(f"num_envs must be in [1, 65536), got {num_envs}.")
    super().__init__(num_envs, n_step, gamma, reward_clip)
    obs_example = np.asarray(obs_example)
    action_example = np.asarray(action_example)
    if obs_example.ndim < 1:
      raise ValueError("observations must be frame stacks [*frame_shape, K]; got a scalar.")
    self.check_stacks = check_stacks
    self._k = obs_example.shape[-1]
    self._obs_shape, self._obs_dtype = obs_example.shape, obs_example.dtype
    self._action_shape, self._action_dtype = action_example.shape, action_example.dtype
    self._stream = (secrets.randbits(47) << 16) + np.arange(num_envs, dtype=np.int64)
    self._seq = np.zeros(num_envs, np.int64)  # next record index of each stream
    self._autoreset = np.zeros(num_envs, bool)  # next step is an autoreset step
    self._new_episode = np.ones(num_envs, bool)  # current obs is a reset obs, pads not emitted

  @property
  def streams(self) -> np.ndarray:
    """The stream id of each sub-env, ``[num_envs]`` int64."""
    return self._stream.copy()

  def reset(self, obs: np.ndarray) -> None:
    """Starts from the observations of ``env.reset()``, ``[num_envs, *frame_shape, K]``."""
    obs = np.asarray(obs)
    if obs.shape != (self.num_envs,) + self._obs_shape:
      raise ValueError(f"reset obs has shape {obs.shape}, expected "
                       f"{(self.num_envs,) + self._obs_shape}.")
    self._current_obs = np.array(obs, copy=True)
    self._autoreset[:] = False
    self._new_episode[:] = True  # a pending episode of a stream is abandoned (never completes)
    self._ep_return[:] = 0.0

  def step(self, action: np.ndarray, reward: np.ndarray, next_obs: np.ndarray,
           terminated: np.ndarray, truncated: np.ndarray) -> FrameRecords:
    """Consumes one vector-env step; returns the records it produces.

    Args:
      action: actions taken at ``self.obs``, ``[num_envs, *action_shape]``.
      reward, terminated, truncated: from ``env.step``, ``[num_envs]``.
      next_obs: observations from ``env.step``, ``[num_envs, *frame_shape, K]``.

    Returns:
      ``FrameRecords`` with, for each sub-env whose step is real (not gymnasium's
      autoreset step): the ``K - 1`` older frames of its reset stack if its current
      observation starts an episode, then its ``STEP`` record, then a ``TERMINATED`` /
      ``TRUNCATED`` record with the final frame if the episode ended.
    """
    if self._current_obs is None:
      raise RuntimeError("FrameStepProcessor.step called before reset(obs).")
    obs, k1 = self._current_obs, self._k - 1
    next_obs = np.asarray(next_obs)
    action = np.asarray(action, self._action_dtype)
    reward = np.asarray(reward, np.float64)
    terminated = np.asarray(terminated, bool)
    truncated = np.asarray(truncated, bool)
    real = ~self._autoreset
    done = real & (terminated | truncated)
    if self.check_stacks and k1 > 0 and real.any():
      both = (next_obs, obs) if real.all() else (next_obs[real], obs[real])
      if not _shifted_by_one(*both):
        raise ValueError(
            "observation is not the previous one shifted by one frame along the last axis; "
            "FrameStepProcessor needs frame stacks [*frame_shape, K] with the newest frame "
            "last (e.g. AtariEnvFactory, or FrameStackObservation moved to the last axis).")
    self._ep_return += np.where(real, reward, 0.0)
    if done.any():
      self._finished_returns.extend(self._ep_return[done].tolist())
      self._ep_return[done] = 0.0
    if self.reward_clip:
      reward = self._clip(reward)

    pad = real & self._new_episode
    pad_e = np.repeat(np.nonzero(pad)[0], k1)  # sub-env of each PAD record
    pad_j = np.tile(np.arange(k1), int(pad.sum()))  # its frame in the reset stack
    step_e = np.nonzero(real)[0]
    fin_e = np.nonzero(done)[0]
    npad = pad * k1
    seq = np.concatenate([self._seq[pad_e] + pad_j, self._seq[step_e] + npad[step_e],
                          self._seq[fin_e] + npad[fin_e] + 1])
    self._seq += npad + real + done
    kinds = np.where(terminated[fin_e], TERMINATED, TRUNCATED)
    n_pad, n_step_rec, n_fin = len(pad_e), len(step_e), len(fin_e)
    n_rec = n_pad + n_step_rec + n_fin
    zeros_action = np.zeros((n_pad,) + self._action_shape, self._action_dtype)
    out = FrameRecords(
        frame=np.concatenate([obs[pad_e, ..., pad_j], obs[step_e, ..., -1],
                              next_obs[fin_e, ..., -1]]).astype(self._obs_dtype, copy=False),
        action=np.concatenate([zeros_action, action[step_e],
                               np.zeros((n_fin,) + self._action_shape, self._action_dtype)]),
        reward=np.concatenate([np.zeros(n_pad), reward[step_e], np.zeros(n_fin)]),
        kind=np.concatenate([np.full(n_pad, PAD), np.full(n_step_rec, STEP), kinds]
                            ).astype(np.int8),
        first=np.concatenate([pad_j == 0, self._new_episode[step_e] & (k1 == 0),
                              np.zeros(n_fin, bool)]),
        stream=np.concatenate([self._stream[pad_e], self._stream[step_e], self._stream[fin_e]]),
        seq=seq,
        n_step=np.full(n_rec, self.n, np.int32),
        gamma=np.full(n_rec, self.gamma, np.float64),
    )
    # After an autoreset step the current observation is a reset one.
    self._new_episode = ~real
    self._autoreset = done
    self._current_obs = np.array(next_obs, copy=True)
    return out


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

  n-step returns and discounts are computed once, when the transition completes, with
  the same float64 arithmetic as ``StepProcessor``: ``terminated`` gives discount 0,
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
        self._powers = gamma ** np.arange(n_step + 1, dtype=np.float64)  # as StepProcessor
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
    c, k = self._capacity, self._k
    n = rec.kind.shape[0]
    a = self._added_total
    pos = a + np.arange(n, dtype=np.int64)
    slots = pos % c

    # 1. The records about to be overwritten: drop the transitions that start there and
    # the ones whose stack begins there (every other record a transition uses is newer).
    old = self._pos[slots] >= 0
    if old.any():
      old_slots = slots[old]
      dep = self._dep[old_slots]
      has = dep >= 0
      dep_slots = dep[has] % c
      # (only if the dependent still is that start and its stack still begins here)
      same = (self._pos[dep_slots] == dep[has]) & (
          self._stack[dep_slots, 0] == self._pos[old_slots][has])
      self._kill(np.concatenate([old_slots, dep_slots[same]]))

    # 2. Predecessors: the previous record of the same stream, in this piece or earlier.
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
    prev = np.where(rec.first, _START, prev)

    # 3. Write the records.
    self._frames[slots] = rec.frame
    self._action[slots] = rec.action
    self._reward[slots] = rec.reward
    self._kind[slots] = rec.kind
    self._pos[slots] = pos
    self._prev[slots] = prev
    self._dep[slots] = _BROKEN
    self._live[slots] = False  # (already dropped in step 1)
    self._added_total = a + n
    lo = max(0, self._added_total - c)  # oldest position still stored

    # 4. Stacks: the K records ending at each new one (markers where there are none).
    stack = np.empty((n, k), np.int64)
    stack[:, k - 1] = pos
    for j in range(k - 2, -1, -1):
      stack[:, j] = self._hop(stack[:, j + 1])
    self._stack[slots] = stack

    # 5. n-step completion: walk back from each new non-PAD record through up to n STEP
    # records of its episode; the one j steps back completes if j == n, or at any j if
    # the new record ends the episode. Horner from the newest reward, as StepProcessor.
    walkers = np.nonzero(rec.kind != PAD)[0]
    w_pos, w_kind = pos[walkers], rec.kind[walkers]
    final = w_kind != STEP
    cur, acc = w_pos.copy(), np.zeros(walkers.size, np.float64)
    active = np.ones(walkers.size, bool)
    starts, rets, discs, boots = [], [], [], []
    for j in range(1, self._n + 1):
      cur = self._hop(cur)
      cs = cur % c
      active &= self._alive(cur) & (self._kind[cs] == STEP)
      acc = np.where(active, self._reward[cs] + self._gamma * acc, acc)
      complete = active & (final | (j == self._n))
      if complete.any():
        starts.append(cur[complete])
        rets.append(acc[complete])
        discs.append(np.where(w_kind[complete] == TERMINATED, 0.0, self._powers[j]))
        boots.append(w_pos[complete])
    if not starts:
      return np.zeros(0, np.int64)
    starts = np.concatenate(starts)
    start_slots = starts % c
    self._ret[start_slots] = np.concatenate(rets).astype(np.float32)
    self._disc[start_slots] = np.concatenate(discs).astype(np.float32)
    self._boot[start_slots] = np.concatenate(boots)
    oldest = self._stack[start_slots, 0]
    ok = oldest >= lo  # whole stack stored (markers are < 0)
    start_slots = start_slots[ok]
    self._live[start_slots] = True
    self._dep[oldest[ok] % c] = starts[ok]
    self._size += start_slots.size
    if len(self._streams) > 4096:  # forget streams whose last record is gone
      self._streams = {s: v for s, v in self._streams.items() if v[1] >= lo}
    return start_slots

  # --- reading -------------------------------------------------------------
  def sample_indices(self, batch_size: int) -> np.ndarray:
    """Live slots drawn uniformly with replacement, ``[batch_size]`` int64."""
    self._check_sample_size(batch_size)
    filled = min(self._added_total, self._capacity)
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
    return {**{k: v.copy() for k, v in self._arrays().items()},
            "streams": dict(self._streams), "n_step": self._n, "gamma": self._gamma,
            "size": self._size, "added_total": self._added_total,
            "rng": self._rng.bit_generator.state}

  def load_state_dict(self, state: dict) -> None:
    arrays = self._arrays()
    for name, store in arrays.items():
      x = np.asarray(state[name])
      if x.shape != store.shape or x.dtype != store.dtype:
        raise ValueError(f"replay state {name!r} is {x.shape} {x.dtype}, this buffer has "
                         f"{store.shape} {store.dtype}; restore into a buffer built with the "
                         "same example and capacity.")
    for name, store in arrays.items():
      store[...] = state[name]
    self._streams = dict(state["streams"])
    self._n, self._gamma = state["n_step"], state["gamma"]
    if self._n is not None:
      self._powers = self._gamma ** np.arange(self._n + 1, dtype=np.float64)
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
