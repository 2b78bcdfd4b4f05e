"""Epsilon-greedy exploration in numpy, on the actor: schedules, the Ape-X ladder, the state.

Used by value-based agents (``agents/dqn.py``) in ``Agent.select``; nothing outside ``agents/``
knows about epsilon.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


def linear_epsilon(env_steps: int, start: float, end: float, decay_steps: int) -> float:
  """Linearly anneals from ``start`` to ``end`` over ``decay_steps`` env steps (plain Python)."""
  frac = min(1.0, env_steps / max(1, decay_steps))
  return start + frac * (end - start)


def apex_epsilons(num: int, epsilon: float = 0.4, alpha: float = 7.0) -> np.ndarray:
  """Ape-X's ladder ``eps_i = epsilon^(1 + alpha * i / (num - 1))``, ``[num]``."""
  if num == 1:
    return np.array([epsilon])
  i = np.arange(num)
  return epsilon ** (1.0 + alpha * i / (num - 1))


def epsilon_greedy(actions: np.ndarray, epsilon: float | np.ndarray, num_actions: int,
                   rng: np.random.Generator) -> np.ndarray:
  """Replaces each of ``actions`` ``[B]`` by a uniform one with probability ``epsilon``
  (scalar or ``[B]``), in numpy: no device round trip on the actor's path."""
  n = actions.shape[0]
  explore = rng.random(n) < epsilon
  if explore.any():
    actions = np.where(explore, rng.integers(0, num_actions, n), actions)
  return actions


class EpsilonState(NamedTuple):
  """An actor's epsilon-greedy state.

  Attributes:
    env_steps: the run's env steps as this actor estimates them (its own steps times the number
      of actors), which the schedule reads.
    steps_per_call: how much one ``select`` call advances ``env_steps`` (its sub-envs times the
      number of actors).
    fixed: per-sub-env epsilons ``[B]`` (an Ape-X ladder slice, or the evaluation epsilon) or a
      scalar; ``None`` follows the schedule.
  """

  env_steps: int
  steps_per_call: int
  fixed: np.ndarray | float | None = None
