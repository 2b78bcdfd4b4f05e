"""What IMPALA and PPO share: the policy heads (categorical for Discrete actions, a diagonal
Gaussian for Box actions), the actor-critic network, the acting side of the contract, and the
pairing of unroll timesteps into transitions.

Both learn from time-major unrolls ``[T + 1, N, ...]`` (``jaxasync.collectors.unrolls``): the
actors sample actions from the policy's distribution and hand its parameters to the learner
as ``extras`` (the behaviour policy, for importance ratios); ``N`` is the unrolls of one SGD
step times their sub-envs, side by side. A ``PolicyHead`` is everything that depends on the
action kind; the losses see only its ``log_prob`` and ``entropy``.

With ``normalize_observations`` the network sees observations standardised by running
statistics (``agents/normalization.py``) that live in the learner's state: the learner
updates them from each batch it trains on, before its SGD step, and publishes them with the
params (``NormalizedPolicyParams``), so actors and the evaluator normalise with exactly the
version they adopted, inside the one jitted ``policy`` call. With ``normalize_rewards`` the
learner divides rewards by the running standard deviation of the discounted return, summed
per sub-env from each episode's start (SB3's ``VecNormalize``, and gym's ``NormalizeReward``
up to 0.25; gymnasium's since 0.26 carries the sum across truncations and drops it at a
termination step itself): each actor's collector continues that return per sub-env
(``Unroll.discounted_return``), and the statistics live in the learner's state beside the
observation ones; rewards enter only the loss, so nothing is published.
"""

from __future__ import annotations

import abc
import dataclasses
import math
from typing import Annotated, Any, Literal, NamedTuple, Sequence

import chex
import flax
import flax.linen as nn
import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import tyro

from jaxasync.agent import ActorContext, Agent, key_data
from jaxasync.agents.learner_state import LearnerState
from jaxasync.agents.normalization import (RunningMeanStd, init_running_stats, normalize,
                                           update_running_stats)
from jaxasync.errors import ConfigError
from jaxasync.pipeline import UnrollConfig
from jaxasync.envs import check_action_box, check_box_observations
from jaxasync.networks import (ACTIVATIONS, Activation, Torso, check_torso, check_torso_fields,
                               default_torso, make_torso)

PyTree = Any
REWARD_SCALE_EPS = 1e-8  # added to the return's variance (VecNormalize's and NormalizeReward's)


# --- policy heads -------------------------------------------------------------------------------
class PolicyHead(abc.ABC):
  """What an actor-critic's policy is over one action kind: the layer that turns the policy
  torso's features into distribution parameters ("dist params", a pytree with leaves
  ``[..., X]``), their log-probabilities and entropy on the learner, and sampling in numpy on
  the actor. Heads are frozen dataclasses (hashable: a field of the Flax network).

  The actor's ``extras`` must hold what the learner needs to rebuild the behaviour policy and
  the action it sampled (``behaviour`` and ``learner_action`` read them back), so the
  importance ratio ``pi / mu`` of a lagged unroll is that of the action actually drawn.
  """

  @abc.abstractmethod
  def dist_params(self, features: jnp.ndarray, module: nn.Module) -> PyTree:
    """Inside ``module``'s ``nn.compact`` call: ``features [B, F]`` -> dist params ``[B, ...]``
    (the layers and params it creates belong to ``module``)."""

  @abc.abstractmethod
  def log_prob(self, dist_params: PyTree, action: jnp.ndarray) -> jnp.ndarray:
    """``log pi(action)``: dist params ``[..., X]``, ``action`` as ``learner_action`` gives it
    ``[..., *]`` -> ``[...]``."""

  @abc.abstractmethod
  def entropy(self, dist_params: PyTree) -> jnp.ndarray:
    """The distribution's entropy: ``[..., X] -> [...]``."""

  @abc.abstractmethod
  def kl_divergence(self, p: PyTree, q: PyTree) -> jnp.ndarray:
    """``KL(p || q)`` of two dist params: ``[..., X], [..., X] -> [...]``."""

  @abc.abstractmethod
  def sample(self, dist_params: PyTree, greedy: bool, rng: np.random.Generator
             ) -> tuple[np.ndarray, dict]:
    """On the actor, numpy dist params ``[B, X]``: ``(env actions [B, ...], extras)``, a
    sample (or the mode when ``greedy``) as the env takes it, and the extras of ``[B, ...]``
    leaves the learner reads back."""

  @abc.abstractmethod
  def extras_example(self) -> dict:
    """One sub-env's ``extras`` (shapes and dtypes, for preallocation)."""

  @abc.abstractmethod
  def behaviour(self, extras: dict) -> PyTree:
    """The behaviour policy's dist params from an unroll's ``extras`` (leaves ``[..., X]``)."""

  @abc.abstractmethod
  def learner_action(self, action: jnp.ndarray, extras: dict) -> jnp.ndarray:
    """The action ``log_prob`` takes, from an unroll's ``action`` and ``extras``."""


@dataclasses.dataclass(frozen=True)
class CategoricalHead(PolicyHead):
  """A softmax over ``num_actions`` logits (Discrete actions); dist params: the logits
  ``[..., A]``; extras ``{"logits"}``; sampling by the Gumbel-max trick, greedy: the argmax."""

  num_actions: int
  dtype: Any = np.int64  # the action space's

  def dist_params(self, features: jnp.ndarray, module: nn.Module) -> jnp.ndarray:
    # Orthogonal with scale 0.01: an almost uniform first policy.
    return nn.Dense(self.num_actions, kernel_init=nn.initializers.orthogonal(0.01))(features)

  def log_prob(self, dist_params: jnp.ndarray, action: jnp.ndarray) -> jnp.ndarray:
    return action_log_prob(dist_params, action)

  def entropy(self, dist_params: jnp.ndarray) -> jnp.ndarray:
    return categorical_entropy(dist_params)

  def kl_divergence(self, p: jnp.ndarray, q: jnp.ndarray) -> jnp.ndarray:
    log_p = jax.nn.log_softmax(p)
    return jnp.sum(jnp.exp(log_p) * (log_p - jax.nn.log_softmax(q)), axis=-1)

  def sample(self, dist_params: np.ndarray, greedy: bool, rng: np.random.Generator
             ) -> tuple[np.ndarray, dict]:
    logits = dist_params
    scores = logits if greedy else logits + rng.gumbel(size=logits.shape)
    return np.argmax(scores, axis=-1).astype(self.dtype), {"logits": logits}

  def extras_example(self) -> dict:
    return {"logits": np.zeros(self.num_actions, np.float32)}

  def behaviour(self, extras: dict) -> jnp.ndarray:
    return extras["logits"]

  def learner_action(self, action: jnp.ndarray, extras: dict) -> jnp.ndarray:
    return action.astype(jnp.int32)


class GaussianParams(NamedTuple):
  """A diagonal Gaussian's parameters, leaves ``[..., A]``."""

  mean: jnp.ndarray
  log_std: jnp.ndarray


def gaussian_log_prob(params: GaussianParams, action: jnp.ndarray) -> jnp.ndarray:
  """``log N(action; mean, exp(log_std)^2)`` summed over the last axis: ``[..., A] -> [...]``."""
  chex.assert_equal_shape((params.mean, params.log_std, action))
  z = (action - params.mean) * jnp.exp(-params.log_std)
  return jnp.sum(-0.5 * jnp.square(z) - params.log_std - 0.5 * math.log(2 * math.pi), axis=-1)


def gaussian_kl(p: GaussianParams, q: GaussianParams) -> jnp.ndarray:
  """``KL(p || q)`` of two diagonal Gaussians, summed over the last axis:
  ``log(s_q / s_p) + (s_p^2 + (m_p - m_q)^2) / (2 s_q^2) - 1/2``; ``[..., A] -> [...]``."""
  chex.assert_equal_shape((p.mean, p.log_std, q.mean, q.log_std))
  var_ratio = jnp.exp(2.0 * (p.log_std - q.log_std))
  mean_term = jnp.square((p.mean - q.mean) * jnp.exp(-q.log_std))
  return jnp.sum(q.log_std - p.log_std + 0.5 * (var_ratio + mean_term - 1.0), axis=-1)


def gaussian_entropy(params: GaussianParams) -> jnp.ndarray:
  """A diagonal Gaussian's entropy, ``sum(log_std + 0.5 log(2 pi e))``: ``[..., A] -> [...]``."""
  return jnp.sum(params.log_std + 0.5 * (1.0 + math.log(2 * math.pi)), axis=-1)


@dataclasses.dataclass(frozen=True)
class GaussianHead(PolicyHead):
  """A diagonal Gaussian over a one-axis Box of ``A`` actions: the mean from the policy torso
  (orthogonal init, scale 0.01), ``log_std`` a learned vector of ``A`` initialised to 0 and
  independent of the state (the PPO paper's and CleanRL's ppo_continuous_action.py's).

  The actor samples ``a ~ N(mean, std)`` and the env gets ``clip(a, low, high)`` (the Box's
  own bounds); extras ``{"mean", "log_std", "raw_action"}`` carry the behaviour policy and the
  unclipped sample, whose log-probability the learner takes (the clipped action's density
  under the Gaussian would be wrong wherever the clip binds). Greedy: the clipped mean.
  """

  num_actions: int
  low: tuple[float, ...]
  high: tuple[float, ...]
  dtype: Any = np.float32  # the action space's

  @staticmethod
  def for_box(space: gym.spaces.Box) -> "GaussianHead":
    # Bounds as tuples: the head is a hashable field of the network.
    return GaussianHead(int(space.shape[0]), tuple(float(x) for x in space.low),
                        tuple(float(x) for x in space.high), space.dtype.type)

  def dist_params(self, features: jnp.ndarray, module: nn.Module) -> GaussianParams:
    mean = nn.Dense(self.num_actions, kernel_init=nn.initializers.orthogonal(0.01))(features)
    log_std = module.param("log_std", nn.initializers.zeros, (self.num_actions,))
    return GaussianParams(mean, jnp.broadcast_to(log_std, mean.shape))

  def log_prob(self, dist_params: GaussianParams, action: jnp.ndarray) -> jnp.ndarray:
    return gaussian_log_prob(dist_params, action)

  def entropy(self, dist_params: GaussianParams) -> jnp.ndarray:
    return gaussian_entropy(dist_params)

  def kl_divergence(self, p: GaussianParams, q: GaussianParams) -> jnp.ndarray:
    return gaussian_kl(p, q)

  def sample(self, dist_params: GaussianParams, greedy: bool, rng: np.random.Generator
             ) -> tuple[np.ndarray, dict]:
    mean, log_std = dist_params
    raw = mean if greedy else (
        mean + np.exp(log_std) * rng.standard_normal(mean.shape, np.float32))
    actions = np.clip(raw, np.asarray(self.low, np.float32), np.asarray(self.high, np.float32))
    return actions.astype(self.dtype), {"mean": mean, "log_std": log_std,
                                        "raw_action": raw.astype(np.float32)}

  def extras_example(self) -> dict:
    zeros = np.zeros(self.num_actions, np.float32)
    return {"mean": zeros, "log_std": zeros.copy(), "raw_action": zeros.copy()}

  def behaviour(self, extras: dict) -> GaussianParams:
    return GaussianParams(extras["mean"], extras["log_std"])

  def learner_action(self, action: jnp.ndarray, extras: dict) -> jnp.ndarray:
    return extras["raw_action"].astype(jnp.float32)


def policy_head(action_space: gym.Space) -> PolicyHead:
  """The head for ``action_space`` (checked by ``check_actor_critic_spaces``)."""
  if isinstance(action_space, gym.spaces.Discrete):
    return CategoricalHead(int(action_space.n), action_space.dtype.type)
  return GaussianHead.for_box(action_space)


class ActorCriticNetwork(nn.Module):
  """``obs [B, *obs_shape] -> (dist params [B, ...], value [B])``.

  Separate torsos for the policy and the value by default (PPO's usual choice on vector
  observations: the value's regression does not disturb the policy's features); one shared
  torso with ``shared_torso`` (IMPALA's, and cheaper for CNNs). The policy's output layer is
  the ``head``'s; the value head is initialised orthogonally with scale 1.

  Attributes:
    head: the policy head (``CategoricalHead``: logits ``[B, A]``; ``GaussianHead``:
      ``GaussianParams``).
    torso: a ``jaxasync.networks`` torso name.
    hidden_sizes: the torso's layer widths.
    shared_torso: one torso for both heads.
    activation: the MLP torso's nonlinearity.
    orthogonal_init: the MLP torso's kernels orthogonal with gain sqrt(2).
  """

  head: PolicyHead
  torso: str = "mlp"
  hidden_sizes: Sequence[int] = (64, 64)
  shared_torso: bool = False
  activation: Activation = "relu"
  orthogonal_init: bool = False

  @nn.compact
  def __call__(self, obs: jnp.ndarray) -> tuple[PyTree, jnp.ndarray]:
    torso = lambda: make_torso(self.torso, self.hidden_sizes, activation=self.activation,
                               orthogonal_init=self.orthogonal_init)
    policy_features = torso()(obs)
    value_features = policy_features if self.shared_torso else torso()(obs)
    # (The policy's layer is made before the value's, so a categorical network's params keep
    # their names: Dense_0 the logits, Dense_1 the value.)
    dist_params = self.head.dist_params(policy_features, self)
    value = nn.Dense(1, kernel_init=nn.initializers.orthogonal(1.0))(value_features)[..., 0]
    return dist_params, value


@flax.struct.dataclass
class ActorCriticState(LearnerState):
  """The learner's state of IMPALA and PPO: ``LearnerState``'s params, opt_state, opt_steps
  (SGD steps for IMPALA, iterations for PPO) and key (PPO's minibatch shuffles), and the
  observation statistics; a pytree (checkpointed leaf by leaf)."""

  # The running observation statistics with ``normalize_observations``; None (no leaves, so
  # the state, its checkpoints and its updates are those of before) without.
  obs_stats: RunningMeanStd | None = None
  # The running statistics of the discounted return (shape ``[]``) with
  # ``normalize_rewards``; None without.
  return_stats: RunningMeanStd | None = None


@flax.struct.dataclass
class NormalizedPolicyParams:
  """What ``policy_params`` publishes with ``normalize_observations``: the network's params
  and the observation statistics of the same learner state (one version, adopted together)."""

  params: PyTree
  obs_stats: RunningMeanStd


class UnrollPairs(NamedTuple):
  """An unroll's ``T`` consecutive-timestep pairs ``(t -> t + 1)``, leaves ``[T, N, ...]``.

  Attributes:
    mask: the pair is a real transition (``~first[t + 1]``): False from an episode's last
      observation to the next episode's reset observation.
    action: action taken at ``t``, as the head's ``log_prob`` takes it (Discrete: int32
      ``[T, N]``; Gaussian: the unclipped sample ``[T, N, A]``).
    behaviour: the actor's dist params at ``t`` (leaves ``[T, N, X]``: categorical, the logits).
    reward: reward of the step ``t -> t + 1``.
    discount: ``gamma`` times the env's discount at ``t + 1`` (0 where the episode
      terminated; ``gamma`` where it was truncated, so ``V(obs[t + 1])``, the true final
      observation, is bootstrapped).
  """

  mask: jnp.ndarray
  action: jnp.ndarray
  behaviour: PyTree
  reward: jnp.ndarray
  discount: jnp.ndarray


def unroll_pairs(unroll, gamma: float, head: PolicyHead) -> UnrollPairs:
  """The transitions of an ``Unroll`` with leaves ``[T + 1, N, ...]`` (dm_env/rlax pairing);
  ``head`` reads the behaviour policy and the action from its ``extras``."""
  behaviour = jax.tree.map(lambda x: x[:-1], head.behaviour(unroll.extras))
  return UnrollPairs(mask=~unroll.first[1:],
                     action=head.learner_action(unroll.action, unroll.extras)[:-1],
                     behaviour=behaviour,
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


def check_actor_critic_spaces(obs_space: gym.Space, action_space: gym.Space, env_id: str,
                              name: str) -> None:
  """Raises ``ConfigError`` unless the spaces suit an actor-critic: Box observations and
  Discrete actions or a one-axis Box of actions with finite bounds."""
  if isinstance(action_space, gym.spaces.Box):
    check_action_box(action_space, env_id, name, "clips its Gaussian actions to the Box's bounds")
  elif not isinstance(action_space, gym.spaces.Discrete):
    raise ConfigError(
        f"{env_id} has action space {action_space}; {name} needs a Discrete action space or a "
        "one-axis Box of actions.")
  check_box_observations(obs_space, env_id, name)


class ActorCritic(Agent):
  """The acting side of IMPALA and PPO, their network and their initial state.

  Actors call ``policy`` (the dist params, one jitted call) and ``select`` (the ``head``'s
  numpy sample, or its mode for a greedy evaluation); the behaviour policy goes to the
  learner as ``extras`` (categorical: ``{"logits"}``; Gaussian: ``{"mean", "log_std",
  "raw_action"}``).

  Subclasses set ``self.optimizer`` (``init`` builds its state) and write ``update``, which
  passes each batch of unrolls through ``normalize_unroll`` before its SGD step (the
  observation statistics, when ``normalize_observations``).

  Args (of subclasses' ``__init__``, through ``_setup``): the config (with ``torso``,
  ``hidden_sizes``, ``shared_torso``, ``data``, ``batch_size``, ``eval_greedy``,
  ``normalize_observations``, ``observation_clip``), the spaces and the env id.
  """

  def _setup(self, config, obs_space: gym.Space, action_space: gym.Space, env_id: str,
             name: str) -> None:
    check_actor_critic_spaces(obs_space, action_space, env_id, name)
    check_torso(config.torso, obs_space.shape, env_id)
    self.keep_config(config, obs_space, action_space)
    self.head = policy_head(action_space)
    torso = (default_torso(obs_space.shape, obs_space.dtype) if config.torso == "auto"
             else config.torso)
    self.network = ActorCriticNetwork(self.head, torso, tuple(config.hidden_sizes),
                                      config.shared_torso, config.activation,
                                      config.orthogonal_init)
    if config.normalize_observations and not np.issubdtype(obs_space.dtype, np.floating):
      # (An image torso scales uint8 pixels itself; standardised floats would be scaled again.)
      raise ConfigError(
          f"{env_id} has {obs_space.dtype} observations; {name}'s normalize_observations "
          "standardises float vector observations. Drop --agent.normalize-observations.")

    def dist_params(params, obs):
      if isinstance(params, NormalizedPolicyParams):  # (a trace-time choice: one jitted call)
        params, obs = params.params, self.normalize_obs(params.obs_stats, obs)
      return self.network.apply(params, obs)[0]
    self._dist_params = jax.jit(dist_params)

  def init_params(self, key: chex.PRNGKey) -> PyTree:
    # numpy: jnp.zeros would warn of a float64 space (MuJoCo's) that JAX truncates anyway.
    obs = np.zeros((1,) + self.obs_space.shape, self.obs_space.dtype)
    return self.network.init(key, obs)

  def apply_unroll(self, params: PyTree, obs: jnp.ndarray) -> tuple[PyTree, jnp.ndarray]:
    """The network over time-major ``obs`` ``[T + 1, N, *obs_shape]``: dist params (leaves
    ``[T + 1, N, X]``) and values ``[T + 1, N]`` (one call over the flattened leading axes).

    The leading axes are flattened batch-major (``[N * (T + 1)]``): a multi-device learner
    shards ``N``, and a reshape that keeps the sharded axis outermost keeps each device's
    items on it; flattening time-major would gather the whole batch onto every device."""
    flat_obs = batch_major(obs)
    dist_params, values = self.network.apply(params, flat_obs)
    unflat = lambda x: jnp.swapaxes(x.reshape(obs.shape[1::-1] + x.shape[1:]), 0, 1)
    return jax.tree.map(unflat, dist_params), unflat(values)

  @staticmethod
  def policy_params(state) -> PyTree:
    """The network's params; with observation statistics in ``state``, those too
    (``NormalizedPolicyParams``), which ``policy`` then applies."""
    if state.obs_stats is None:
      return state.params
    return NormalizedPolicyParams(state.params, state.obs_stats)

  def normalize_obs(self, obs_stats: RunningMeanStd, obs: jnp.ndarray) -> jnp.ndarray:
    """``obs [..., *obs_shape]`` standardised by ``obs_stats`` and clipped at
    ``observation_clip``: what the network sees with ``normalize_observations``."""
    return normalize(obs_stats, obs, self.config.observation_clip)

  def normalize_unroll(self, state: ActorCriticState, unroll):
    """The learner's step before an SGD step on ``unroll`` (leaves ``[T + 1, N, ...]``):
    ``state``'s statistics updated from its observations, and the unroll with its ``obs``
    normalised by the updated ones (both unchanged without ``normalize_observations``), and
    with ``normalize_rewards`` its rewards scaled (``_scale_rewards``).

    Each observation is counted once: only ``obs[:-1]`` (every one the env emitted, episodes'
    final and reset observations included), since ``obs[T]`` is the next unroll's ``obs[0]``
    from the same envs and counts there. Every actor's unrolls count alike, by the data the
    learner trains on, so no actor's stream weighs more than its share of the batches."""
    if state.return_stats is not None:
      state, unroll = self._scale_rewards(state, unroll)
    if state.obs_stats is None:
      return state, unroll
    obs_stats = update_running_stats(state.obs_stats, batch_major(unroll.obs[:-1]))
    return (state.replace(obs_stats=obs_stats),
            unroll._replace(obs=self.normalize_obs(obs_stats, unroll.obs)))

  def _scale_rewards(self, state: ActorCriticState, unroll):
    """``normalize_rewards``: the return statistics updated from ``unroll.discounted_return``
    ``[T + 1, N]`` and its rewards divided by their standard deviation (not centred, as
    ``VecNormalize`` and ``NormalizeReward``: a shift would change which episodes are worth
    ending), clipped at ``reward_clip``.

    Each step counts once: rows ``1..T`` (row 0 is the previous unroll's row ``T``) but the
    first timesteps of episodes, which are no steps (their return restarts at 0)."""
    if unroll.discounted_return is None:
      raise ValueError("normalize_rewards needs unrolls with discounted_return: a collector "
                       "built with the agent's unroll_return_discount() tracks it.")
    chex.assert_equal_shape((unroll.discounted_return, unroll.reward))
    return_stats = update_running_stats(state.return_stats,
                                        batch_major(unroll.discounted_return[1:]),
                                        mask=batch_major(~unroll.first[1:]))
    clip = self.config.reward_clip
    scaled = jnp.clip(unroll.reward / jnp.sqrt(return_stats.var + REWARD_SCALE_EPS), -clip, clip)
    return state.replace(return_stats=return_stats), unroll._replace(reward=scaled)

  def extras_example(self) -> dict:
    return self.head.extras_example()

  def unroll_return_discount(self) -> float | None:
    """``gamma`` with ``normalize_rewards`` (the return whose spread scales the rewards)."""
    return self.config.gamma if self.config.normalize_rewards else None

  def initial_actor_state(self, context: ActorContext) -> bool:
    """Whether to act greedily: only when evaluating with ``eval_greedy``."""
    return bool(context.evaluation and self.config.eval_greedy)

  def policy(self, params: PyTree, obs: np.ndarray, rng: np.random.Generator,
             explore: bool = True) -> PyTree:
    """The policy's dist params (leaves ``[B, X]``, float32 numpy: categorical, the logits)."""
    return jax.tree.map(lambda x: np.asarray(x, np.float32), self._dist_params(params, obs))

  def select(self, dist_params: PyTree, greedy: bool, rng: np.random.Generator
             ) -> tuple[np.ndarray, dict, bool]:
    """The head's sample per row (categorical: Gumbel-max), or its mode when ``greedy``; extras:
    the behaviour policy (and the head's unclipped sample)."""
    actions, extras = self.head.sample(dist_params, greedy, rng)
    return actions, extras, greedy

  def init(self, key: chex.PRNGKey) -> ActorCriticState:
    """The initial state: the network's params, the subclass's ``self.optimizer`` state, and
    the PRNG key of the update (PPO's minibatch shuffles)."""
    params = self.init_params(key)
    obs_stats = (init_running_stats(self.obs_space.shape)
                 if self.config.normalize_observations else None)
    return_stats = init_running_stats(()) if self.config.normalize_rewards else None
    return ActorCriticState(params=params, opt_state=self.optimizer.init(params),
                            opt_steps=jnp.zeros((), jnp.int32),
                            key=key_data(jax.random.fold_in(key, 1)), obs_stats=obs_stats,
                            return_stats=return_stats)


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
    eval_greedy: evaluate with the mode (the argmax action, or the Gaussian's clipped mean;
      False: sample, as in training).
    normalize_observations: the network sees observations standardised per feature by
      running statistics, clipped at observation_clip (CleanRL's MuJoCo PPO). The
      statistics live in the learner's state (checkpointed), count each observation of the
      batches trained on once (updated before each SGD step), and are published with the
      params, so actors and the evaluator apply the very version they adopted. Float
      (vector) observations only.
    observation_clip: the bound of the normalised observations (gymnasium's and CleanRL's 10).
    normalize_rewards: rewards divided by the running standard deviation of the discounted
      return (gamma) summed from each episode's start (SB3's VecNormalize; the reward scaling
      of CleanRL's MuJoCo PPO), then clipped at reward_clip. Each actor continues that return
      per sub-env (it holds the stream); the statistics live in the learner's state
      (checkpointed) and count every step of the batches trained on once. The values learn
      the scaled returns.
    reward_clip: with normalize_rewards, the bound of the scaled rewards (CleanRL's 10).
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
  normalize_observations: bool = False
  observation_clip: float = 10.0
  normalize_rewards: bool = False
  reward_clip: float = 10.0
  data: Annotated[UnrollConfig, tyro.conf.arg(name="")] = dataclasses.field(
      default_factory=UnrollConfig)

  def validate(self) -> None:
    check_torso_fields(self.torso, self.hidden_sizes)
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
    if not 0.0 < self.observation_clip <= float("inf"):
      raise ConfigError(f"observation_clip must be > 0 (inf: no clip), got "
                        f"{self.observation_clip}.")
    if not 0.0 < self.reward_clip <= float("inf"):
      raise ConfigError(f"reward_clip must be > 0 (inf: no clip), got {self.reward_clip}.")
