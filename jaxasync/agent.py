"""The agent contract: what an algorithm implements, and all that the rest of jaxasync calls.

An agent is three pure pieces plus a statement of the data it learns from:

* the learner side: ``init(key) -> state``, ``update(state, batch, weights) -> (state, metrics,
  feedback)`` (jitted, ``k`` SGD steps per call) and ``policy_params(state)``, the part of the
  state published to actors;
* the actor side, split in two so that SEED-style central inference can batch the network over
  many actors while each actor keeps its own exploration:
  ``policy(params, obs, rng, explore) -> outputs`` (the batched network call, the only device
  dispatch per vector step) and ``select(outputs, actor_state, rng) -> (action, extras,
  actor_state)`` (numpy, on the actor: epsilon, sampling, noise schedules...). ``act`` is the
  two in a row, for actors that hold their own params copy and for the evaluator;
* ``data``: its data pipeline (``jaxasync.pipeline``: a ``ReplayConfig`` or an
  ``UnrollConfig``, from its own config), which builds the collector its actors run and the
  data source that feeds ``update``.

Actors, inference servers, the evaluator and the learner loop call these members and nothing
else, so a new algorithm is a new subclass of ``Agent`` (``agents/dqn.py`` is the worked
example) and needs no change to the machinery. ``Agent`` is an abstract base class rather than
a ``Protocol`` so that a missing member fails at construction, with its name, not deep inside
an actor process.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any

import chex
import gymnasium as gym
import jax
import numpy as np

from jaxasync.pipeline import DataPipeline

PyTree = Any


@dataclasses.dataclass(frozen=True)
class ActorContext:
  """Who is about to act, for ``Agent.initial_actor_state``.

  Attributes:
    actor_id: this actor's index in ``[0, num_actors)`` (0 for the synchronous loop's actor).
    num_actors: actors in the run; together they step ``num_actors * num_envs`` sub-envs.
    num_envs: sub-envs of this actor's vector env: the batch size of its ``obs``.
    env_steps: env steps this actor took before (non-zero after a restart, so that schedules
      continue where they were).
    evaluation: the state is for the evaluator (e.g. DQN's small evaluation epsilon).
  """

  actor_id: int = 0
  num_actors: int = 1
  num_envs: int = 1
  env_steps: int = 0
  evaluation: bool = False


class Agent(abc.ABC):
  """The contract every algorithm implements (see the module docstring for the picture).

  Shapes: ``B`` is the number of sub-envs an actor steps (its vector env's batch), ``k`` the SGD
  steps of one ``update`` call, ``N`` the batch size of one SGD step (``batch_size``).

  Attributes (set by the subclass's ``__init__``):
    obs_space: one sub-env's observation space.
    action_space: one sub-env's action space.
    batch_size: items (transitions, or unrolls) per SGD step; the data source samples ``k`` of
      these per ``update`` call.
    data: its ``DataPipeline`` (the ``data`` field of its config): what it learns from.
  """

  obs_space: gym.Space
  action_space: gym.Space
  batch_size: int
  data: DataPipeline

  def keep_config(self, config: Any, obs_space: gym.Space, action_space: gym.Space) -> None:
    """Keeps a validated ``config`` (with ``batch_size`` and its pipeline ``data``) and the
    spaces: sets ``config``, ``obs_space``, ``action_space``, ``batch_size`` and ``data``."""
    self.config = config
    self.obs_space, self.action_space = obs_space, action_space
    self.batch_size = config.batch_size
    self.data = config.data

  # --- learner side ----------------------------------------------------------------------
  @abc.abstractmethod
  def init(self, key: chex.PRNGKey) -> PyTree:
    """The initial learner state (params, optimizer state, targets, ...): one pytree, which is
    what checkpoints hold."""

  @abc.abstractmethod
  def update(self, state: PyTree, batch: PyTree, weights: np.ndarray | None = None
             ) -> tuple[PyTree, dict, Any]:
    """``k`` SGD steps over ``batch`` (leaves ``[k, N, ...]``; unrolls ``[k, T+1, N, ...]``).

    Args:
      state: from ``init`` or the previous call; may be donated (do not reuse it).
      batch: from the data source.
      weights: importance weights ``[k, N]`` (prioritized replay), or ``None``.

    Returns:
      ``(state, metrics, feedback)``: the new state; scalars (device arrays are fine: they are
      read once per record interval); what the data source wants back (a prioritized replay:
      new priorities ``[k, N]``), or ``None``.
    """

  @abc.abstractmethod
  def policy_params(self, state: PyTree) -> PyTree:
    """The part of ``state`` actors need (published every ``sync_interval`` SGD steps)."""

  def evaluation_params(self, state: PyTree) -> PyTree:
    """The params the evaluations, the best checkpoint's score, ``enjoy`` and the videos run:
    ``policy_params(state)`` unless the agent evaluates another copy of its policy (DQN's
    target network, ``DQNConfig.evaluate``); the same pytree structure as ``policy_params``."""
    return self.policy_params(state)

  # --- actor side ------------------------------------------------------------------------
  @abc.abstractmethod
  def initial_actor_state(self, context: ActorContext) -> PyTree:
    """An actor's exploration state (e.g. DQN's epsilons and step count); any picklable value."""

  @abc.abstractmethod
  def policy(self, params: PyTree, obs: np.ndarray, rng: np.random.Generator,
             explore: bool = True) -> PyTree:
    """The network's outputs for ``obs`` ``[B, *obs_shape]``: numpy arrays with leading axis
    ``[B]`` (DQN: greedy actions; an actor-critic: logits). One jitted call, on whatever device
    ``params`` live on. ``explore=False`` asks for the evaluation policy (e.g. noisy nets' mean
    weights); ``rng`` seeds any noise drawn inside the network."""

  @abc.abstractmethod
  def select(self, outputs: PyTree, actor_state: PyTree, rng: np.random.Generator
             ) -> tuple[np.ndarray, PyTree, PyTree]:
    """``(actions [B, ...], extras, actor_state)`` from ``policy``'s ``outputs``, on the actor.

    Exploration lives here. ``extras`` is what the learner needs about the behaviour policy
    (leaves ``[B, ...]``: log-probs, logits) or ``None``; collectors store it without knowing
    what it is. Actions have the action space's dtype.
    """

  def act(self, params: PyTree, obs: np.ndarray, actor_state: PyTree,
          rng: np.random.Generator, explore: bool = True) -> tuple[np.ndarray, PyTree, PyTree]:
    """``select(policy(params, obs, rng, explore), actor_state, rng)``: the actor's one call."""
    return self.select(self.policy(params, obs, rng, explore), actor_state, rng)

  def extras_example(self) -> PyTree:
    """One sub-env's ``extras`` from ``select`` (leaves without the ``[B]`` axis), so that
    collectors can preallocate them; ``None`` when ``select`` returns none."""
    return None

  def unroll_return_discount(self) -> float | None:
    """The discount of the running return an unroll collector tracks per sub-env
    (``Unroll.discounted_return``, for reward scaling), or ``None`` (the default): none."""
    return None

  def actor_metrics(self, actor_state: PyTree) -> dict[str, float]:
    """Scalars about an actor's exploration worth recording (DQN: its mean epsilon)."""
    return {}

  def divergence_hint(self) -> str:
    """The fix to suggest when training diverges (NaN or infinite loss or state)."""
    return ("Lower the learning rate, e.g. 10x, or check the env's rewards and observations "
            "for NaN or huge values.")

  def overestimation_hint(self) -> str:
    """The fix to suggest when the run's Q-values stay above the largest return its replay
    supports (``RunLedger.on_record``'s watch)."""
    return "Try a lower learning rate."


def key_data(key: jax.Array) -> jax.Array:
  """Raw ``uint32`` key data (what agents keep in their checkpointable state), whether ``key``
  is a typed key (``jax.random.key``) or already raw (``jax.random.PRNGKey``)."""
  if jax.numpy.issubdtype(key.dtype, jax.dtypes.prng_key):
    return jax.random.key_data(key)
  return key
