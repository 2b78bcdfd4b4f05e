"""What the continuous-control agents (``agents/sac.py``, ``agents/td3.py``) share: the action
Box's scaling, the space checks, their configs' shared fields (``ContinuousConfig``), the
policies (squashed Gaussian, deterministic), the twin Q critic, the actors' exploration state
with its random warmup (``ExplorationState``), and ``ContinuousAgent``: their construction,
their actor state and their ``k``-step update with delayed policy steps.

Actions inside the networks are normalised to ``[-1, 1]^A``; ``scale_actions`` maps them to the
action Box's own bounds (asymmetric ones too) on the way to the env and the replay,
``unscale_actions`` maps stored actions back on the way into the critics. Noise (exploration,
target smoothing) is drawn in the normalised space, so one standard deviation means the same
for every Box.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Annotated, Any, Callable, ClassVar, Literal, NamedTuple, Sequence

import chex
import distrax
import flax.linen as nn
import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import tyro

from jaxasync.agent import ActorContext, Agent
from jaxasync.envs import check_action_box, check_box_observations
from jaxasync.errors import ConfigError, check_positive
from jaxasync.networks import (MLPTorso, Torso, check_torso, check_torso_fields, default_torso,
                               make_torso)
from jaxasync.pipeline import ReplayConfig
from jaxasync.types import Transition

PyTree = Any


# --- the action Box ------------------------------------------------------------------------------
def scale_actions(action: chex.Array, low: chex.Array, high: chex.Array) -> chex.Array:
  """Maps actions in ``[-1, 1]^A`` to the Box ``[low, high]`` (``[..., A]``, affine; numpy in,
  numpy out)."""
  return low + 0.5 * (action + 1.0) * (high - low)


def unscale_actions(action: chex.Array, low: chex.Array, high: chex.Array) -> chex.Array:
  """Inverse of ``scale_actions``, clipped to ``[-1, 1]`` (stored float32 actions may round
  just outside)."""
  return jnp.clip(2.0 * (action - low) / (high - low) - 1.0, -1.0, 1.0)


def check_continuous_spaces(obs_space: gym.Space, action_space: gym.Space, env_id: str,
                            agent: str) -> None:
  """Raises ``ConfigError`` unless the spaces suit a continuous-control agent named ``agent``:
  a Box of observations and a one-axis Box of actions with finite bounds."""
  if isinstance(action_space, gym.spaces.Discrete):
    raise ConfigError(
        f"{env_id} has a Discrete action space ({action_space}); {agent} is for continuous "
        "actions. Use DQN or Rainbow (experiments/dqn.py, experiments/rainbow.py) instead.")
  if not isinstance(action_space, gym.spaces.Box):
    raise ConfigError(f"{env_id} has action space {action_space}; {agent} needs a Box of "
                      "actions.")
  check_action_box(action_space, env_id, agent, "squashes its actions into the Box's bounds")
  check_box_observations(obs_space, env_id, agent)


# --- the configs' shared fields ------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ContinuousConfig:
  """The fields SAC's and TD3's configs share, and their checks. A subclass declares a field
  again for a default of its own (SAC: the step sizes; TD3: policy_delay; the field keeps its
  place) and describes in its own docstring the shared fields whose meaning is its own
  (``--help`` reads the subclass's docstring first).

  Attributes:
    torso: network body of the policy and the critics; 'auto' picks by observation
      (networks.default_torso): CNNs for images, MLP for vectors.
    hidden_sizes: MLP layer widths (vector observations); a CNN's dense width is the last one.
    actor_learning_rate: Adam step size of the policy.
    critic_learning_rate: Adam step size of the critics.
    adam_eps: Adam epsilon (every optimizer).
    max_grad_norm: global-norm gradient clipping of each network's gradients; 0: none.
    batch_size: transitions per SGD step.
    tau: Polyak factor of the target networks.
    policy_delay: critic steps per policy step.
    random_warmup: actors take uniform random actions (over the Box) during the data's
      warmup_period, as the SAC and TD3 papers, CleanRL and SB3 do; False: the initial policy
      (with its exploration) from the first step.
    data: what it learns from (``ReplayConfig``; 1-step returns by default).
  """

  torso: Literal["auto", Torso] = "auto"
  hidden_sizes: Sequence[int] = (256, 256)
  actor_learning_rate: float = 3e-4
  critic_learning_rate: float = 3e-4
  adam_eps: float = 1e-8
  max_grad_norm: float = 0.0
  batch_size: int = 256
  tau: float = 0.005
  policy_delay: int = 1
  random_warmup: bool = True
  data: Annotated[ReplayConfig, tyro.conf.arg(name="")] = dataclasses.field(
      default_factory=lambda: ReplayConfig(n_step=1))

  def validate(self) -> None:
    """Raises ``ConfigError`` (one line naming the field and the fix) for a bad shared field
    or data pipeline; a subclass checks its own fields after ``super().validate()``."""
    check_torso_fields(self.torso, self.hidden_sizes, "(256, 256)")
    check_positive(self, ("actor_learning_rate", "critic_learning_rate"))
    if self.batch_size < 1:
      raise ConfigError(f"batch_size must be >= 1, got {self.batch_size}.")
    if not 0.0 < self.tau <= 1.0:
      raise ConfigError(f"tau must be in (0, 1], got {self.tau}.")
    if self.policy_delay < 1:
      raise ConfigError(f"policy_delay must be >= 1 (1: an actor step per critic step), got "
                        f"{self.policy_delay}.")
    if not self.max_grad_norm >= 0.0:
      raise ConfigError(f"max_grad_norm must be >= 0 (0: no clipping), got "
                        f"{self.max_grad_norm}.")
    self.data.validate(self.batch_size)


# --- the critics' loss ----------------------------------------------------------------------------
def twin_td_loss(q: chex.Array, target: chex.Array, weights: chex.Array
                 ) -> tuple[chex.Array, chex.Array]:
  """``0.5 * sum_i mean_b w_b (Q_i(s_b, a_b) - y_b)^2`` and ``|TD|`` per item.

  Args:
    q: both critics at the stored ``(s, a)``, ``[2, B]``.
    target: ``y`` ``[B]`` (no gradient flows into it here).
    weights: importance weights ``[B]`` (ones for a uniform replay).

  Returns:
    ``(loss, abs_td)``: a scalar and the mean of the two critics' ``|TD|``, ``[B]``.
  """
  chex.assert_rank((q, target, weights), (2, 1, 1))
  chex.assert_equal_shape((q[0], target, weights))
  td = q - jax.lax.stop_gradient(target)[None]
  loss = 0.5 * jnp.sum(jnp.mean(weights[None] * jnp.square(td), axis=-1))
  return loss, jnp.mean(jnp.abs(td), axis=0)


# --- delayed policy steps inside a k-step update ------------------------------------------------
def every_nth_step(n: int, step_count: jnp.ndarray, step: Callable[[None], Any],
                   skip: Callable[[None], Any]) -> tuple[Any, jnp.ndarray]:
  """``(step(None) if step_count % n == 0 else skip(None), ran)`` inside a trace: ``lax.cond``
  (both branches return the same pytree structure), a plain call when ``n`` is 1; ``ran`` is
  a float32 scalar, 1.0 where ``step`` ran."""
  if n == 1:
    return step(None), jnp.ones((), jnp.float32)
  do = step_count % n == 0
  return jax.lax.cond(do, step, skip, None), do.astype(jnp.float32)


def mean_over_steps(metrics: dict[str, jnp.ndarray], updated: jnp.ndarray,
                    delayed: Sequence[str]) -> dict[str, jnp.ndarray]:
  """Each metric ``[k]`` averaged over the ``k`` SGD steps of one update call, those named in
  ``delayed`` over the steps that took a policy step only (``updated`` ``[k]``, 1.0 where one
  was taken), so that a delayed actor's loss is not diluted by the steps that skipped it."""
  policy_steps = jnp.maximum(jnp.sum(updated), 1.0)
  out = {}
  for name, values in metrics.items():
    if name in delayed:
      out[name] = jnp.sum(values * updated) / policy_steps
    else:
      out[name] = jnp.mean(values)
  return out


class ExplorationState(NamedTuple):
  """An actor's exploration state (``ContinuousAgent.initial_actor_state``).

  Attributes:
    env_steps: the run's env steps as this actor estimates them (its own steps times the number
      of actors), compared with ``random_steps``.
    steps_per_call: how much one ``select`` call advances ``env_steps`` (its sub-envs times the
      number of actors); 0 for the evaluator.
    explore: add exploration (False: the evaluator's deterministic policy).
    random_steps: run env steps during which actions are uniform random (0: none).
  """

  env_steps: int
  steps_per_call: int
  explore: bool
  random_steps: int


def warming_up(actor_state: ExplorationState) -> bool:
  """Whether the actor still acts uniformly at random (the random warmup)."""
  return actor_state.explore and actor_state.env_steps < actor_state.random_steps


def advanced(actor_state: ExplorationState) -> ExplorationState:
  """``actor_state`` after one ``select`` call."""
  return actor_state._replace(env_steps=actor_state.env_steps + actor_state.steps_per_call)


class ContinuousAgent(Agent):
  """What SAC and TD3 share around their maths: the checks and the action Box at construction
  (``setup``), and ``update`` as ``k`` of the subclass's SGD steps in one jitted ``lax.scan``.

  A subclass sets ``name`` (named in errors) and ``policy_metrics`` (the metrics of its delayed
  policy step), calls ``setup`` first thing in its ``__init__`` and implements ``_sgd_step``.
  Its config is a ``ContinuousConfig``.

  Attributes (set by ``setup``): ``action_dim`` (``A``), ``low`` and ``high`` (the Box's bounds,
  float32 ``[A]``), as well as the contract's.
  """

  name: ClassVar[str]
  policy_metrics: ClassVar[tuple[str, ...]]

  def setup(self, config: ContinuousConfig, obs_space: gym.Space, action_space: gym.Space,
            env_id: str) -> tuple[str, tuple[int, ...]]:
    """Checks the spaces and ``config``, keeps them, and returns the networks' torso name
    ('auto' resolved by the observations) and hidden sizes."""
    check_continuous_spaces(obs_space, action_space, env_id, self.name)
    config.validate()
    check_torso(config.torso, obs_space.shape, env_id)
    self.keep_config(config, obs_space, action_space)
    self.action_dim = int(action_space.shape[0])
    self.low = np.asarray(action_space.low, np.float32)
    self.high = np.asarray(action_space.high, np.float32)
    self._jitted_update = jax.jit(self._update, donate_argnums=0)
    torso = (default_torso(obs_space.shape, obs_space.dtype) if config.torso == "auto"
             else config.torso)
    return torso, tuple(config.hidden_sizes)

  def initial_actor_state(self, context: ActorContext) -> ExplorationState:
    """Exploration continued from the actor's ``env_steps`` (the run's steps estimated as its
    own times the actors), with the data's ``warmup_period`` of uniform random actions when
    ``random_warmup``; none for the evaluator."""
    if context.evaluation:
      return ExplorationState(env_steps=0, steps_per_call=0, explore=False, random_steps=0)
    random_steps = self.data.warmup_period if self.config.random_warmup else 0
    return ExplorationState(env_steps=context.env_steps * context.num_actors,
                            steps_per_call=context.num_envs * context.num_actors, explore=True,
                            random_steps=random_steps)

  def actor_metrics(self, actor_state: ExplorationState | None) -> dict[str, float]:
    """``random_actions``: 1 while the actor still acts uniformly at random (the warmup)."""
    return {"random_actions": float(actor_state is not None and warming_up(actor_state))}

  def skipped_policy_metrics(self) -> dict[str, jnp.ndarray]:
    """The policy metrics of an SGD step that took no policy step (zeros, left out of the
    averages by ``mean_over_steps``)."""
    return {name: jnp.zeros(()) for name in self.policy_metrics}

  def divergence_hint(self) -> str:
    c = self.config
    return (f"Lower the learning rates (now actor {c.actor_learning_rate:g}, critic "
            f"{c.critic_learning_rate:g}), e.g. 3-10x, scale the env's rewards down, or check "
            "its rewards and observations for NaN or huge values.")

  @abc.abstractmethod
  def _sgd_step(self, state: PyTree, inputs: tuple[Transition, jnp.ndarray]
                ) -> tuple[PyTree, tuple[jnp.ndarray, dict, jnp.ndarray]]:
    """One SGD step on ``(batch, weights)`` (leaves ``[N, ...]``, ``[N]``): the new state and
    ``(|TD| [N], metrics, updated)``, ``updated`` 1.0 where a policy step was taken."""

  def update(self, state: PyTree, batch: Transition, weights: jnp.ndarray | None = None
             ) -> tuple[PyTree, dict, jnp.ndarray]:
    """``k`` SGD steps over ``batch`` (leaves ``[k, N, ...]``), jitted, ``state`` donated.

    Returns the new state, metrics averaged over the ``k`` steps (the policy's over the steps
    that took one) and ``|TD|`` ``[k, N]`` as the data source's feedback (priorities).
    """
    return self._jitted_update(state, batch, weights)

  def _update(self, state: PyTree, batch: Transition, weights: jnp.ndarray | None = None
              ) -> tuple[PyTree, dict, jnp.ndarray]:
    if weights is None:
      weights = jnp.ones(batch.reward.shape, jnp.float32)
    state, (abs_td, metrics, updated) = jax.lax.scan(self._sgd_step, state, (batch, weights))
    return state, mean_over_steps(metrics, updated, self.policy_metrics), abs_td


# --- the networks --------------------------------------------------------------------------------
class GaussianPolicy(nn.Module):
  """``obs [B, *obs_shape] -> (mean [B, A], log_std [B, A])`` of the Gaussian before the tanh.

  ``log_std`` is squashed smoothly into ``[log_std_min, log_std_max]`` (a rescaled tanh, as
  CleanRL's SAC) rather than clipped, so its gradient never vanishes at the bounds.

  Attributes:
    action_dim: ``A``.
    torso: a ``jaxasync.networks`` torso name.
    hidden_sizes: the torso's layer widths.
    log_std_min, log_std_max: bounds of ``log_std``.
  """

  action_dim: int
  torso: str = "mlp"
  hidden_sizes: Sequence[int] = (256, 256)
  log_std_min: float = -5.0
  log_std_max: float = 2.0

  @nn.compact
  def __call__(self, obs: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    x = make_torso(self.torso, self.hidden_sizes)(obs)
    mean = nn.Dense(self.action_dim)(x)
    log_std = jnp.tanh(nn.Dense(self.action_dim)(x))
    log_std = self.log_std_min + 0.5 * (self.log_std_max - self.log_std_min) * (log_std + 1.0)
    return mean, log_std


def squashed_gaussian(mean: jnp.ndarray, log_std: jnp.ndarray) -> distrax.Distribution:
  """``tanh(N(mean, exp(log_std)^2))`` with diagonal covariance, over ``[-1, 1]^A``.

  ``log_prob`` / ``sample_and_log_prob`` include the tanh's change of variables
  (``- sum_i log(1 - tanh(u_i)^2)``), computed stably by distrax from the pre-tanh sample.
  """
  base = distrax.MultivariateNormalDiag(mean, jnp.exp(log_std))
  return distrax.Transformed(base, distrax.Block(distrax.Tanh(), ndims=1))


class DeterministicPolicy(nn.Module):
  """``obs [B, *obs_shape] -> tanh(Dense(torso(obs)))``, actions ``[B, A]`` in ``[-1, 1]``
  (TD3's and DDPG's actor; CleanRL's ``Actor`` without its scaling, which ``scale_actions``
  does outside the network).

  Attributes:
    action_dim: ``A``.
    torso: a ``jaxasync.networks`` torso name.
    hidden_sizes: the torso's layer widths.
  """

  action_dim: int
  torso: str = "mlp"
  hidden_sizes: Sequence[int] = (256, 256)

  @nn.compact
  def __call__(self, obs: jnp.ndarray) -> jnp.ndarray:
    x = make_torso(self.torso, self.hidden_sizes)(obs)
    return jnp.tanh(nn.Dense(self.action_dim)(x))


class QCritic(nn.Module):
  """``(obs [B, *obs_shape], action [B, A]) -> Q [B]``.

  Vector observations: an MLP over ``concat(obs, action)``. Images: the CNN torso over ``obs``,
  then one dense layer over ``concat(features, action)``.
  """

  torso: str = "mlp"
  hidden_sizes: Sequence[int] = (256, 256)

  @nn.compact
  def __call__(self, obs: jnp.ndarray, action: jnp.ndarray) -> jnp.ndarray:
    action = action.astype(jnp.float32)
    if self.torso == "mlp":
      x = obs.reshape(obs.shape[0], -1).astype(jnp.float32)
      x = MLPTorso(tuple(self.hidden_sizes))(jnp.concatenate([x, action], axis=-1))
    else:
      x = make_torso(self.torso, self.hidden_sizes)(obs)
      x = nn.relu(nn.Dense(self.hidden_sizes[-1])(jnp.concatenate([x, action], axis=-1)))
    return nn.Dense(1)(x)[..., 0]


# Two independently initialised critics evaluated in one call: params get a leading axis of 2,
# outputs are ``[2, B]``. Each twin's params are a ``QCritic``'s: ``one_twin`` takes one out.
TwinQCritic = nn.vmap(QCritic, variable_axes={"params": 0}, split_rngs={"params": True},
                      in_axes=None, out_axes=0, axis_size=2)


def one_twin(twin_params: PyTree, index: int) -> PyTree:
  """Twin ``index``'s params (every leaf's leading axis of 2 indexed), for a ``QCritic``."""
  return jax.tree.map(lambda leaf: leaf[index], twin_params)
