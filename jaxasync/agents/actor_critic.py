"""What IMPALA and PPO share: a categorical actor-critic network, the acting side of the
contract, and the pairing of unroll timesteps into transitions.

Both learn from time-major unrolls ``[T + 1, N, ...]`` (``jaxasync.collectors.unrolls``): the
actors sample actions from the policy's logits and hand the logits to the learner as
``extras`` (the behaviour policy, for importance ratios); ``N`` is the unrolls of one SGD
step times their sub-envs, side by side.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Literal, NamedTuple, Sequence

import chex
import flax
import flax.linen as nn
import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import optax
import tyro

from jaxasync.agent import ActorContext, Agent, key_data
from jaxasync.errors import ConfigError
from jaxasync.pipeline import UnrollConfig
from jaxasync.envs import check_box_observations
from jaxasync.networks import (ACTIVATIONS, TORSOS, Activation, Torso, check_torso, default_torso,
                               make_torso)

PyTree = Any


class ActorCriticNetwork(nn.Module):
  """``obs [B, *obs_shape] -> (logits [B, A], value [B])``.

  Separate torsos for the policy and the value by default (PPO's usual choice on vector
  observations: the value's regression does not disturb the policy's features); one shared
  torso with ``shared_torso`` (IMPALA's, and cheaper for CNNs). The heads are initialised
  orthogonally with scales 0.01 (an almost uniform first policy) and 1.

  Attributes:
    num_actions: ``A``.
    torso: a ``jaxasync.networks`` torso name.
    hidden_sizes: the torso's layer widths.
    shared_torso: one torso for both heads.
    activation: the MLP torso's nonlinearity.
    orthogonal_init: the MLP torso's kernels orthogonal with gain sqrt(2).
  """

  num_actions: int
  torso: str = "mlp"
  hidden_sizes: Sequence[int] = (64, 64)
  shared_torso: bool = False
  activation: Activation = "relu"
  orthogonal_init: bool = False

  @nn.compact
  def __call__(self, obs: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    torso = lambda: make_torso(self.torso, self.hidden_sizes, activation=self.activation,
                               orthogonal_init=self.orthogonal_init)
    policy_features = torso()(obs)
    value_features = policy_features if self.shared_torso else torso()(obs)
    logits = nn.Dense(self.num_actions, kernel_init=nn.initializers.orthogonal(0.01))(
        policy_features)
    value = nn.Dense(1, kernel_init=nn.initializers.orthogonal(1.0))(value_features)[..., 0]
    return logits, value


@flax.struct.dataclass
class ActorCriticState:
  """The learner's state of IMPALA and PPO: a pytree (checkpointed leaf by leaf)."""

  params: PyTree
  opt_state: PyTree
  opt_steps: jnp.ndarray  # int32 scalar: SGD steps (IMPALA) or PPO iterations taken
  key: jnp.ndarray  # uint32[2] PRNG key data (PPO's minibatch shuffles)


class UnrollPairs(NamedTuple):
  """An unroll's ``T`` consecutive-timestep pairs ``(t -> t + 1)``, leaves ``[T, N, ...]``.

  Attributes:
    mask: the pair is a real transition (``~first[t + 1]``): False from an episode's last
      observation to the next episode's reset observation.
    action: action taken at ``t``.
    behaviour_logits: the actor's logits at ``t`` (``[T, N, A]``).
    reward: reward of the step ``t -> t + 1``.
    discount: ``gamma`` times the env's discount at ``t + 1`` (0 where the episode
      terminated; ``gamma`` where it was truncated, so ``V(obs[t + 1])``, the true final
      observation, is bootstrapped).
  """

  mask: jnp.ndarray
  action: jnp.ndarray
  behaviour_logits: jnp.ndarray
  reward: jnp.ndarray
  discount: jnp.ndarray


def unroll_pairs(unroll, gamma: float) -> UnrollPairs:
  """The transitions of an ``Unroll`` with leaves ``[T + 1, N, ...]`` (dm_env/rlax pairing)."""
  return UnrollPairs(mask=~unroll.first[1:], action=unroll.action[:-1].astype(jnp.int32),
                     behaviour_logits=unroll.extras["logits"][:-1],
                     reward=unroll.reward[1:].astype(jnp.float32),
                     discount=gamma * unroll.discount[1:].astype(jnp.float32))


def action_log_prob(logits: jnp.ndarray, action: jnp.ndarray) -> jnp.ndarray:
  """``log softmax(logits)[action]``: logits ``[..., A]``, action ``[...]`` -> ``[...]``."""
  log_probs = jax.nn.log_softmax(logits)
  return jnp.take_along_axis(log_probs, action[..., None], axis=-1)[..., 0]


def categorical_entropy(logits: jnp.ndarray) -> jnp.ndarray:
  """Entropy of ``softmax(logits)``: ``[..., A] -> [...]``."""
  log_probs = jax.nn.log_softmax(logits)
  return -jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1)


def batch_major(x: jnp.ndarray) -> jnp.ndarray:
  """Time-major ``[T, N, ...]`` flattened to ``[N * T, ...]`` with ``N`` outermost (item ``n``'s
  ``T`` steps contiguous), so that a learner sharding ``N`` over devices keeps the shards."""
  return jnp.swapaxes(x, 0, 1).reshape((-1,) + x.shape[2:])


def masked_mean(x: jnp.ndarray, mask: jnp.ndarray) -> jnp.ndarray:
  """Mean of ``x`` over the entries where ``mask`` is True (0 when there is none)."""
  mask = mask.astype(x.dtype)
  return jnp.sum(x * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def masked_standardize(x: jnp.ndarray, mask: jnp.ndarray) -> jnp.ndarray:
  """``x`` less its mean, over its standard deviation, both over the entries where ``mask`` is
  True (the advantage normalisation of PPO implementations)."""
  mean = masked_mean(x, mask)
  std = jnp.sqrt(masked_mean(jnp.square(x - mean), mask))
  return (x - mean) / (std + 1e-8)


def check_discrete_actor_critic_spaces(obs_space: gym.Space, action_space: gym.Space,
                                       env_id: str, name: str) -> None:
  """Raises ``ConfigError`` unless the spaces suit a categorical actor-critic."""
  if not isinstance(action_space, gym.spaces.Discrete):
    raise ConfigError(
        f"{env_id} has action space {action_space}; {name} here has a categorical policy and "
        "needs a Discrete action space. For continuous actions use SAC (experiments/sac.py).")
  check_box_observations(obs_space, env_id, name)


class DiscreteActorCritic(Agent):
  """The acting side of IMPALA and PPO, their network and their initial state.

  Actors call ``policy`` (the logits, one jitted call) and ``select`` (a categorical sample
  by the Gumbel-max trick in numpy, or the argmax for a greedy evaluation); the logits go
  to the learner as ``extras["logits"]``.

  Subclasses set ``self.optimizer`` (``init`` builds its state) and write ``update``.

  Args (of subclasses' ``__init__``, through ``_setup``): the config (with ``torso``,
  ``hidden_sizes``, ``shared_torso``, ``data``, ``batch_size``, ``eval_greedy``),
  the spaces and the env id.
  """

  def _setup(self, config, obs_space: gym.Space, action_space: gym.Space, env_id: str,
             name: str) -> None:
    check_discrete_actor_critic_spaces(obs_space, action_space, env_id, name)
    check_torso(config.torso, obs_space.shape, env_id)
    self.keep_config(config, obs_space, action_space)
    self.num_actions = int(action_space.n)
    torso = (default_torso(obs_space.shape, obs_space.dtype) if config.torso == "auto"
             else config.torso)
    self.network = ActorCriticNetwork(self.num_actions, torso, tuple(config.hidden_sizes),
                                      config.shared_torso, config.activation,
                                      config.orthogonal_init)
    self.logits = jax.jit(lambda params, obs: self.network.apply(params, obs)[0])

  def init_params(self, key: chex.PRNGKey) -> PyTree:
    obs = jnp.zeros((1,) + self.obs_space.shape, self.obs_space.dtype)
    return self.network.init(key, obs)

  def apply_unroll(self, params: PyTree, obs: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    """The network over time-major ``obs`` ``[T + 1, N, *obs_shape]``: logits
    ``[T + 1, N, A]`` and values ``[T + 1, N]`` (one call over the flattened leading axes).

    The leading axes are flattened batch-major (``[N * (T + 1)]``): a multi-device learner
    shards ``N``, and a reshape that keeps the sharded axis outermost keeps each device's
    items on it; flattening time-major would gather the whole batch onto every device."""
    flat_obs = batch_major(obs)
    logits, values = self.network.apply(params, flat_obs)
    unflat = lambda x: jnp.swapaxes(x.reshape(obs.shape[1::-1] + x.shape[1:]), 0, 1)
    return unflat(logits), unflat(values)

  @staticmethod
  def policy_params(state) -> PyTree:
    return state.params

  def extras_example(self) -> dict:
    return {"logits": np.zeros(self.num_actions, np.float32)}

  def initial_actor_state(self, context: ActorContext) -> bool:
    """Whether to act greedily: only when evaluating with ``eval_greedy``."""
    return bool(context.evaluation and self.config.eval_greedy)

  def policy(self, params: PyTree, obs: np.ndarray, rng: np.random.Generator,
             explore: bool = True) -> np.ndarray:
    """The policy's logits ``[B, A]`` (float32 numpy)."""
    return np.asarray(self.logits(params, obs), np.float32)

  def select(self, logits: np.ndarray, greedy: bool, rng: np.random.Generator
             ) -> tuple[np.ndarray, dict, bool]:
    """A sample of ``softmax(logits)`` per row (Gumbel-max), or the argmax when ``greedy``;
    extras: the logits."""
    scores = logits if greedy else logits + rng.gumbel(size=logits.shape)
    actions = np.argmax(scores, axis=-1).astype(self.action_space.dtype)
    return actions, {"logits": logits}, greedy

  def init(self, key: chex.PRNGKey) -> ActorCriticState:
    """The initial state: the network's params, the subclass's ``self.optimizer`` state, and
    the PRNG key of the update (PPO's minibatch shuffles)."""
    params = self.init_params(key)
    return ActorCriticState(params=params, opt_state=self.optimizer.init(params),
                            opt_steps=jnp.zeros((), jnp.int32),
                            key=key_data(jax.random.fold_in(key, 1)))


@dataclasses.dataclass(frozen=True)
class ActorCriticConfig:
  """The settings IMPALA's and PPO's configs share (each subclass sets its own defaults).

  Attributes:
    torso: network body; 'auto' picks by observation (CNNs for images, MLP for vectors).
    hidden_sizes: MLP layer widths (a CNN's dense width is the last one).
    shared_torso: one torso for the policy and value heads (False: one each).
    activation: the MLP torso's nonlinearity ('relu' or 'tanh').
    orthogonal_init: start the MLP torso's kernels orthogonal with gain sqrt(2) (False:
      Flax's LeCun normal).
    batch_size: unrolls per SGD step (PPO: per iteration), their sub-envs side by side.
    gamma: discount per env step.
    learning_rate: Adam step size (the initial one when annealed).
    learning_rate_decay_steps: SGD steps (PPO: iterations) over which the step size anneals
      linearly to 0; 0: constant.
    adam_eps: Adam epsilon.
    max_grad_norm: global-norm gradient clipping; 0: none.
    entropy_cost: weight of the entropy bonus.
    eval_greedy: evaluate with the argmax action (False: sample, as in training).
    data: what it learns from: unrolls of ``unroll_length`` steps through a queue that drops
      those older than ``max_policy_lag`` SGD steps (``UnrollConfig``; shown among the
      agent's flags, ``--agent.unroll-length``).
  """

  torso: Literal["auto", Torso] = "auto"
  hidden_sizes: Sequence[int] = (64, 64)
  shared_torso: bool = False
  activation: Activation = "relu"
  orthogonal_init: bool = False
  batch_size: int = 2
  gamma: float = 0.99
  learning_rate: float = 1e-3
  learning_rate_decay_steps: int = 0
  adam_eps: float = 1e-8
  max_grad_norm: float = 40.0
  entropy_cost: float = 0.01
  eval_greedy: bool = True
  data: Annotated[UnrollConfig, tyro.conf.arg(name="")] = dataclasses.field(
      default_factory=UnrollConfig)

  def validate(self) -> None:
    if self.torso not in ("auto", *TORSOS):
      raise ConfigError(f"torso must be 'auto' or one of {TORSOS}, got {self.torso!r}.")
    if not self.hidden_sizes:
      raise ConfigError("hidden_sizes must name at least one layer width, e.g. (64, 64).")
    if self.activation not in ACTIVATIONS:
      raise ConfigError(f"activation must be one of {tuple(ACTIVATIONS)}, got {self.activation!r}.")
    if self.batch_size < 1:
      raise ConfigError(f"batch_size must be >= 1, got {self.batch_size}.")
    self.data.validate(self.batch_size)
    if not 0.0 <= self.gamma <= 1.0:
      raise ConfigError(f"gamma must be in [0, 1], got {self.gamma}.")
    if not 0.0 < self.learning_rate < float("inf"):
      raise ConfigError(f"learning_rate must be a finite number > 0, got {self.learning_rate}.")
    if self.learning_rate_decay_steps < 0:
      raise ConfigError(f"learning_rate_decay_steps must be >= 0 (0: constant), got "
                        f"{self.learning_rate_decay_steps}.")
    if not self.max_grad_norm >= 0.0:
      raise ConfigError(f"max_grad_norm must be >= 0 (0: no clipping), got {self.max_grad_norm}.")
