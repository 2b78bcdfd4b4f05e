"""Core pytree types shared by actors, replay and learners."""

from __future__ import annotations

from typing import Any, NamedTuple

import chex
import numpy as np

PyTree = Any


class Transition(NamedTuple):
  """An n-step transition, or a batch of them (leading axes ``[...]``).

  A NamedTuple (a JAX pytree), not a chex dataclass: step processors build one per
  env step on the actor's hot path, and a tuple costs a tenth of a dataclass to make.

  Attributes:
    obs: observation at the start of the transition, ``[..., *obs_shape]``.
    action: action taken at ``obs``, ``[..., *action_shape]``.
    reward: discounted n-step reward ``sum_{k<m} gamma^k r_{t+k}``, ``[...]``,
      where ``m <= n`` is the number of real steps the transition spans.
    discount: bootstrap factor for ``next_obs``, ``[...]``: ``gamma^m`` when the
      value of ``next_obs`` must be added (not done, or truncated), ``0`` when the
      episode terminated inside the transition.
    next_obs: observation to bootstrap from, ``[..., *obs_shape]``; for a
      truncated episode this is the true final observation, never the reset one.
    extras: the agent's ``extras`` at ``obs`` (what ``Agent.select`` returned with
      ``action``: a pytree with leaves ``[..., *leaf_shape]``), or ``None`` (no leaves).
  """

  obs: chex.Array
  action: chex.Array
  reward: chex.Array
  discount: chex.Array
  next_obs: chex.Array
  extras: Any = None

  def replace(self, **fields) -> "Transition":
    """A copy with ``fields`` replaced (as chex dataclasses' ``replace``)."""
    return self._replace(**fields)


class ModelInfo(NamedTuple):
  """What the learner publishes and actors adopt (border's ``SyncModel::model_info``).

  Attributes:
    version: the learner's optimization-step count when the params were exported.
    params: the policy params pytree, copies never donated by the learner: numpy arrays for
      stores that leave the process, device copies for in-process ones (``ParamStore``).
  """

  version: int
  params: PyTree


def storage_dtype(dtype) -> np.dtype:
  """The dtype observations of ``dtype`` are stored in (replays, collectors, chunks): float32
  for float64 (MuJoCo's), since JAX computes in float32 unless ``jax_enable_x64`` is on, and
  float64 would double the replay and every chunk's bytes for nothing; others as they are."""
  dtype = np.dtype(dtype)
  if dtype == np.float64:
    import jax  # (here: this module stays importable without initialising JAX)
    if not jax.config.jax_enable_x64:
      return np.dtype(np.float32)
  return dtype


def transition_example(obs_space, action_space, extras_example: PyTree = None) -> Transition:
  """One transition of zeros (no batch axis) shaped for the given gymnasium spaces (and the
  agent's ``extras_example``); observations in their ``storage_dtype``."""
  obs = np.zeros(obs_space.shape, storage_dtype(obs_space.dtype))
  action = np.zeros(action_space.shape, action_space.dtype)
  return Transition(
      obs=obs,
      action=action,
      reward=np.zeros((), np.float32),
      discount=np.zeros((), np.float32),
      next_obs=obs.copy(),
      extras=extras_example,
  )
