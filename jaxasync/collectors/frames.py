"""The frame collector: vector-env steps over stacked frames as ``FrameRecords``, each frame once.

The actor's half of the frame replay (``jaxasync.replay.frames``, whose module docstring
draws the records of an episode): a record per observed frame, tagged with a stream id (one
per sub-env, unique across actors) and a per-stream sequence number; the replay links them
into stacks and n-step transitions.
"""

from __future__ import annotations

import secrets
from typing import NamedTuple

import numpy as np

from jaxasync.collectors.nstep import ProcessorBase

# Record kinds.
PAD, STEP, TERMINATED, TRUNCATED = 0, 1, 2, 3


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
      self._end_episodes(done)
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
