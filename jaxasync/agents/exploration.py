"""Epsilon-greedy exploration in numpy, on the actor: schedules, the Ape-X ladder, the state,
and ``EpsilonGreedyActing``, the acting side the value-based agents share (``agents/dqn.py``,
``agents/pqn.py``); nothing outside ``agents/`` knows about epsilon.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import gymnasium as gym
import numpy as np

from jaxasync.agent import ActorContext


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


class EpsilonSettings(Protocol):
  """The config fields epsilon-greedy acting reads (``DQNConfig``'s, ``PQNConfig``'s)."""

  eps_start: float
  eps_end: float
  eps_decay_steps: int
  eval_epsilon: float


class EpsilonGreedyActing:
  """The ``Agent`` members of epsilon-greedy acting around a ``policy`` that returns greedy
  actions ``[B]``: the schedule (``epsilon``), ``initial_actor_state`` (``EpsilonState``),
  ``select``, ``fixed_epsilon`` and ``actor_metrics``.

  Listed before ``Agent`` among an agent's bases (``class DQN(EpsilonGreedyActing, Agent)``),
  whose ``__init__`` sets ``config`` (``EpsilonSettings``), ``num_actions`` and
  ``action_space``. An agent changes the schedule by overriding ``epsilon`` (DQN: 0 with
  noisy nets) and gives training actors fixed epsilons with ``training_epsilons`` (DQN's
  Ape-X ladder).
  """

  config: EpsilonSettings
  num_actions: int
  action_space: gym.spaces.Discrete

  def epsilon(self, env_steps: int) -> float:
    """The schedule's epsilon after ``env_steps`` (all envs together): linear from
    ``eps_start`` to ``eps_end`` over ``eps_decay_steps``."""
    c = self.config
    return linear_epsilon(env_steps, c.eps_start, c.eps_end, c.eps_decay_steps)

  def training_epsilons(self, context: ActorContext) -> np.ndarray | float | None:
    """A training actor's fixed epsilons (scalar or ``[num_envs]``); None: the schedule."""
    return None

  def initial_actor_state(self, context: ActorContext) -> EpsilonState:
    """The evaluation epsilon, the actor's ``training_epsilons``, or the schedule, continued
    from the actor's ``env_steps`` (the run's steps estimated as its own times the actors)."""
    fixed = (self.config.eval_epsilon if context.evaluation
             else self.training_epsilons(context))
    return EpsilonState(context.env_steps * context.num_actors,
                        context.num_envs * context.num_actors, fixed)

  def fixed_epsilon(self, epsilon: float | np.ndarray) -> EpsilonState:
    """An actor state that explores with ``epsilon`` (scalar or ``[B]``) at every step."""
    return EpsilonState(0, 0, epsilon)

  def select(self, actions: np.ndarray, actor_state: EpsilonState, rng: np.random.Generator
             ) -> tuple[np.ndarray, None, EpsilonState]:
    """Epsilon-greedy on top of ``policy``'s greedy ``actions`` ``[B]``; no extras. The
    state counts env steps whatever epsilon it explores with."""
    eps = actor_state.fixed
    if eps is None:
      eps = self.epsilon(actor_state.env_steps)
    if actor_state.steps_per_call:
      actor_state = actor_state._replace(
          env_steps=actor_state.env_steps + actor_state.steps_per_call)
    actions = epsilon_greedy(actions, eps, self.num_actions, rng)
    return actions.astype(self.action_space.dtype, copy=False), None, actor_state

  def actor_metrics(self, actor_state: EpsilonState) -> dict[str, float]:
    """The actor's epsilon (the mean over its sub-envs when they differ)."""
    eps = actor_state.fixed
    if eps is None:
      eps = self.epsilon(actor_state.env_steps)
    return {"epsilon": float(np.mean(eps))}
