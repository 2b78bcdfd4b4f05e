"""The n-step collector: the steps of a gymnasium vector env as n-step transitions.

The synchronous ``Trainer`` and every ``Actor`` of a replay agent run it (the frame replay's
agents run ``collectors.frames.FrameStepProcessor``, which shares ``ProcessorBase``). The
returns themselves come from ``collectors.returns.n_step_returns``.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from jaxasync.collectors.base import CollectorBase
from jaxasync.collectors.returns import n_step_returns
from jaxasync.pipeline import check_return_settings
from jaxasync.types import Transition


class ProcessorBase(CollectorBase):
  """What the n-step collectors share (``StepProcessor``, ``collectors.frames.FrameStepProcessor``):
  the checked n-step settings and reward clipping, over ``CollectorBase``'s episode returns.

  Args:
    num_envs: sub-envs in the vector env.
    n_step: ``n >= 1``.
    gamma: discount in ``[0, 1]``.
    reward_clip: ``c > 0`` clips each env reward to ``[-c, c]`` before the n-step sum
      (Atari's reward clipping); ``0``: none. Episode returns stay unclipped.
  """

  def __init__(self, num_envs: int, n_step: int, gamma: float, reward_clip: float):
    check_return_settings(n_step, gamma, reward_clip)
    super().__init__(num_envs)
    self.n, self.gamma = n_step, gamma
    self.reward_clip = float(reward_clip)

  def _clip(self, reward: np.ndarray) -> np.ndarray:
    """``reward`` clipped to ``[-reward_clip, reward_clip]``; call only when ``reward_clip``."""
    return np.clip(reward, -self.reward_clip, self.reward_clip)


class StepProcessor(ProcessorBase):
  """n-step transitions from a gymnasium 1.x vector env in ``NEXT_STEP`` autoreset mode.

  Every sub-env ``e`` keeps the last ``n`` (obs, action, reward) of its current
  episode in a ring shared by all sub-envs (they step in lockstep), so one call
  costs a handful of numpy operations whatever ``num_envs`` is.

  Episode ends:
    * terminated at step ``t``: every pending transition is emitted with
      ``discount = 0`` (no bootstrap).
    * truncated at step ``t``: every pending transition is emitted with
      ``discount = gamma^m`` and ``next_obs`` = the observation the env returned
      at ``t``, which in ``NEXT_STEP`` mode is the true final observation.
    * the step after a done step is gymnasium's autoreset step: the action is
      ignored, the returned observation is the reset one, and no transition is
      made from it.
  No transition straddles two episodes.

  Args:
    num_envs: sub-envs in the vector env.
    obs_example: one observation (no batch axis) giving shape and dtype.
    action_example: one action (no batch axis) giving shape and dtype.
    n_step, gamma, reward_clip: see ``ProcessorBase``.
  """

  def __init__(self, num_envs: int, obs_example: np.ndarray, action_example: np.ndarray,
               n_step: int = 1, gamma: float = 0.99, reward_clip: float = 0.0,
               extras_example: Any = None):
    super().__init__(num_envs, n_step, gamma, reward_clip)
    # The agent's extras ride along with the action they came with (one ring per leaf).
    self._ext_def = None
    if extras_example is not None:
      leaves, self._ext_def = jax.tree_util.tree_flatten(extras_example)
      self._ext = [np.zeros((n_step, num_envs) + np.shape(x), np.asarray(x).dtype) for x in leaves]
    obs_example = np.asarray(obs_example)
    action_example = np.asarray(action_example)
    self._obs_dtype, self._act_dtype = obs_example.dtype, action_example.dtype
    self._obs = np.zeros((n_step, num_envs) + obs_example.shape, obs_example.dtype)
    self._act = np.zeros((n_step, num_envs) + action_example.shape, action_example.dtype)
    self._rew = np.zeros((n_step, num_envs), np.float64)
    self._len = np.zeros(num_envs, np.int64)  # pending steps of each sub-env
    self._t = 0  # ring position of the next step
    self._autoreset = np.zeros(num_envs, bool)  # next step is an autoreset step
    self._any_autoreset = False  # self._autoreset.any()
    # Precomputed for the per-step work. Rows j = 0..n-1 of the ring in time order are the
    # pending entries from oldest (started k = n - 1 - j steps ago) to newest.
    j = np.arange(n_step)
    self._k_of_j = (n_step - 1 - j)[:, None]
    self._oldest_row = (j == 0)[:, None]
    self._slot_of_j = [(s - (n_step - 1 - j)) % n_step for s in range(n_step)]  # by t % n
    self._no_ends = np.zeros(num_envs, bool)  # (terminated of full windows: none)
    self._empty = Transition(
        obs=self._obs[:0, 0], action=self._act[:0, 0], reward=np.zeros(0, np.float32),
        discount=np.zeros(0, np.float32), next_obs=self._obs[:0, 0])

  def reset(self, obs: np.ndarray) -> None:
    """Starts from the observations of ``env.reset()``, ``[num_envs, *obs_shape]``."""
    self._current_obs = np.array(obs, dtype=self._obs_dtype)  # (a copy)
    self._len[:] = 0
    self._autoreset[:] = False
    self._any_autoreset = False
    self._ep_return[:] = 0.0

  def step(self, action: np.ndarray, reward: np.ndarray, next_obs: np.ndarray,
           terminated: np.ndarray, truncated: np.ndarray, extras: Any = None) -> Transition:
    """Consumes one vector-env step; returns the transitions it completes.

    Args:
      action: actions taken at ``self.obs``, ``[num_envs, *action_shape]``.
      reward, terminated, truncated: from ``env.step``, ``[num_envs]``.
      next_obs: observations from ``env.step``, ``[num_envs, *obs_shape]``.
      extras: the agent's extras chosen with ``action`` (leaves ``[num_envs, ...]``), when
        the processor was built with an ``extras_example``; each transition carries those
        of its first step.

    Returns:
      A ``Transition`` batch ``[m, ...]`` (``m`` may be 0), ordered by sub-env
      then by start time.
    """
    if self._current_obs is None:
      raise RuntimeError("StepProcessor.step called before reset(obs).")
    if (extras is None) != (self._ext_def is None):
      raise ValueError(
          "extras passed to a StepProcessor built without extras_example, or the reverse: "
          "build it with the agent's extras_example() (the Trainer does).")
    ext = None if extras is None else jax.tree_util.tree_leaves(extras)
    # The cost of a step is numpy call overhead (a few envs, tiny arrays). Every path takes
    # its returns from n_step_returns, the one n-step computation, which costs ~5-10 us per
    # vector step more than the hand-specialised paths it replaced (8 envs: 12 us at n=1,
    # 31-35 us at n=3-5, against ~140 us for a CartPole env step and ~250 us for a policy
    # call on this CPU).
    action, reward, next_obs = np.asarray(action), np.asarray(reward), np.asarray(next_obs)
    if next_obs.dtype != self._obs_dtype:  # (float64 observations, stored as float32)
      next_obs = next_obs.astype(self._obs_dtype)
    terminated, truncated = np.asarray(terminated), np.asarray(truncated)
    if terminated.dtype != bool or truncated.dtype != bool:
      terminated, truncated = terminated.astype(bool), truncated.astype(bool)
    any_autoreset = self._any_autoreset
    done = terminated | truncated
    self._ep_return += reward
    if self.reward_clip:  # (checked here: no call on the actor's path when off)
      reward = self._clip(reward)
    if any_autoreset:
      real = ~self._autoreset  # sub-envs whose step is a real transition
      done &= real
      terminated = terminated & real
      self._ep_return[self._autoreset] = 0.0  # (was 0.0 since the episode's end)
    else:
      real = None  # every sub-env's step is real
    any_done = np.count_nonzero(done) > 0  # faster than done.any() on small arrays
    if any_done:
      self._end_episodes(done)
    if self.n == 1:
      out = self._step_one(action, reward, next_obs, terminated, real, ext)
    else:
      out = self._step_n(action, reward, next_obs, terminated, done, any_done, real, ext)
    self._autoreset = done
    self._any_autoreset = any_done
    self._t += 1
    return out

  def _extras(self, leaves) -> Any:
    return None if leaves is None else jax.tree_util.tree_unflatten(self._ext_def, leaves)

  def _step_one(self, action, reward, next_obs, terminated, real, ext) -> Transition:
    """n = 1: each real step is one transition, discount ``gamma`` or 0; no ring needed.

    The arrays returned may be shared with ``self.obs`` and the next call's output (the
    observations are copied once, not per use): treat them as read-only.
    """
    obs = self._current_obs
    self._current_obs = next_obs = np.array(next_obs, copy=True)
    if obs.dtype != self._obs_dtype:
      obs = obs.astype(self._obs_dtype)
    if real is None:  # no autoreset step: one transition per sub-env, in order
      g_t, discount_t = n_step_returns(reward[None], terminated, self.gamma)
      return Transition(
          obs=obs, action=action.astype(self._act_dtype), reward=g_t[0].astype(np.float32),
          discount=discount_t[0].astype(np.float32), next_obs=next_obs,
          extras=None if ext is None else self._extras([np.array(x) for x in ext]))
    es = real.nonzero()[0]
    g_t, discount_t = n_step_returns(reward[None, es], terminated[es], self.gamma)
    return Transition(
        obs=obs[es], action=action[es].astype(self._act_dtype, copy=False),
        reward=g_t[0].astype(np.float32), discount=discount_t[0].astype(np.float32),
        next_obs=next_obs[es],
        extras=None if ext is None else self._extras([np.asarray(x)[es] for x in ext]))

  def _step_n(self, action, reward, next_obs, terminated, done, any_done, real,
              ext) -> Transition:
    """n > 1: the step enters the ring; the windows it closes leave it as transitions."""
    slot = self._push(action, reward, ext, real)
    self._current_obs = np.array(next_obs, copy=True)
    in_order = self._slot_of_j[slot]  # ring slots in time order, oldest first
    if not any_done:
      return self._full_windows(in_order, next_obs, ext)
    # Emitted: every pending entry of a sub-env whose episode ended, else a full window's
    # oldest; ordered by sub-env, then oldest entry first.
    g_t, discount_t = n_step_returns(self._rew[in_order], terminated, self.gamma)
    emit = (self._k_of_j < self._len) & (done | self._oldest_row)
    es, js = emit.T.nonzero()
    slots = in_order[js]
    out = Transition(
        obs=self._obs[slots, es],
        action=self._act[slots, es],
        reward=g_t[js, es].astype(np.float32),
        discount=discount_t[js, es].astype(np.float32),
        next_obs=next_obs[es],
        extras=None if ext is None else self._extras([r[slots, es] for r in self._ext]),
    )
    # Bookkeeping: a full window drops its oldest entry; an episode end clears all.
    self._len = np.where(done, 0, np.minimum(self._len, self.n - 1))
    return out

  def _push(self, action, reward, ext, real) -> int:
    """Writes the step at obs ``self.obs`` into the ring; returns its slot."""
    slot = self._t % self.n
    self._obs[slot] = self._current_obs
    self._act[slot] = action
    if ext is not None:
      for ring, x in zip(self._ext, ext):
        ring[slot] = x
    self._rew[slot] = reward
    if real is None:
      self._len += 1
    else:
      self._len += real
    return slot

  def _full_windows(self, in_order, next_obs, ext) -> Transition:
    """No episode ended: only windows of n steps close, one transition (the oldest entry)
    from each sub-env holding n entries; the ring then drops that entry."""
    n = self.n
    es = (self._len == n).nonzero()[0]
    if es.shape[0] == 0:
      if ext is not None:
        return self._empty._replace(extras=self._extras([r[0, :0] for r in self._ext]))
      return self._empty
    self._len[es] = n - 1
    g_t, discount_t = n_step_returns(self._rew[in_order[:, None], es], self._no_ends[:es.shape[0]],
                                     self.gamma)
    oldest = in_order[0]
    return Transition(
        obs=self._obs[oldest, es], action=self._act[oldest, es],
        reward=g_t[0].astype(np.float32), discount=discount_t[0].astype(np.float32),
        next_obs=next_obs[es],
        extras=None if ext is None else self._extras([r[oldest, es] for r in self._ext]))
