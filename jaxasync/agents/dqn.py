"""DQN and its Rainbow-style extensions: an ``Agent`` (``jaxasync.agent``) over pure functions.

The loss is one object chosen by ``DQNConfig.loss`` (``jaxasync.agents.dqn_losses``):
``QLearning`` (double by default, optionally a Maxmin ensemble), ``Munchausen`` or
``Categorical`` (C51); the network head is built from what it needs (atoms, ensemble size).

The contract's pieces:
  * ``policy(params, obs, rng, explore)``: greedy actions, one jitted call on whatever device
    ``params`` live on (actors commit their copy to the CPU; SEED inference servers run it for
    many actors at once);
  * ``select(actions, actor_state, rng)``: epsilon-greedy in numpy around it (the schedule, an
    Ape-X ladder slice, or the evaluation epsilon: ``EpsilonState``);
  * ``update(state, batch, weights)``: ``k`` SGD steps in one call (``lax.scan``) on the default
    device, since per-call dispatch dominates small updates; its feedback is the new priorities.

With ``DQNConfig(noisy=True)`` the Q head is made of ``NoisyDense`` layers (NoisyNet): all
noise comes from explicit PRNG keys. ``policy`` draws a fresh noise sample per call from a seed
it takes from the numpy ``rng`` (``explore=False``: the mean network, for evaluation),
``update`` splits ``DQNState.key`` per SGD step into independent keys for online(obs),
online(next_obs) and target(next_obs), and the epsilon schedule is 0 (noise replaces
epsilon-greedy).
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, ClassVar, Literal, Sequence

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
from jaxasync.agents.exploration import EpsilonGreedyActing, apex_epsilons
from jaxasync.agents.learner_state import LearnerState
from jaxasync.errors import ConfigError
from jaxasync.envs import check_box_observations
from jaxasync.agents import optimizers
from jaxasync.agents.dqn_losses import Categorical, DQNLoss, QLearning, QOutputs
from jaxasync.agents.q_network import QNetwork
from jaxasync.agents.target_updates import HardCopy, Polyak, TargetUpdate
from jaxasync.networks import Torso, check_torso, check_torso_fields, default_torso
from jaxasync.pipeline import ReplayConfig
from jaxasync.types import Transition

PyTree = Any


@dataclasses.dataclass(frozen=True)
class DQNConfig:
  """Hyperparameters of the DQN learner and its epsilon-greedy policy.

  Attributes:
    torso: network body; 'auto' picks by observation (networks.default_torso): Nature CNN
      for Atari frame stacks, MinAtar CNN for small grids, MLP for vectors.
    hidden_sizes: MLP layer widths (vector observations); the MinAtar CNN's dense width is
      the last one.
    layer_norm: LayerNorm before each ReLU of the torso (each Dense of the MLP; each conv,
      over its channels, and the dense layer of a CNN).
    learning_rate: Adam step size (the initial one when annealed).
    learning_rate_end: step size reached after learning_rate_decay_steps.
    learning_rate_decay_steps: SGD steps over which the step size anneals linearly from
      learning_rate to learning_rate_end, then holds; 0: constant.
    adam_eps: Adam epsilon.
    max_grad_norm: global-norm gradient clipping threshold; 0: none.
    batch_size: transitions per SGD step.
    loss: the loss, which also decides the Q head: QLearning (expected Q, double by
      default), Munchausen (expected Q, Munchausen target) or Categorical (C51); the first two
      may regress a Maxmin ensemble (num_q_networks). On the command line: a subcommand after
      every other flag, its own flags after it.
    target_update: how the target network follows the online one: Polyak (averaging, tau
      per SGD step) or HardCopy (a copy every period SGD steps); a subcommand, as loss is.
    dueling: dueling head (separate value and advantage streams).
    eps_start: epsilon-greedy exploration at env step 0.
    eps_end: epsilon-greedy exploration after eps_decay_steps.
    eps_decay_steps: env steps (all envs together) over which epsilon falls linearly from
      eps_start to eps_end.
    exploration: 'schedule' (every actor follows eps_start -> eps_end) or 'apex' (a fixed
      Ape-X epsilon ladder over all sub-envs of all actors).
    apex_epsilon: Ape-X ladder base: sub-env i of N explores with epsilon
      apex_epsilon^(1 + apex_alpha * i / (N - 1)).
    apex_alpha: Ape-X ladder exponent (see apex_epsilon).
    eval_epsilon: epsilon-greedy exploration during evaluation (0: greedy).
    evaluate: which network the evaluations, the best checkpoint's score, enjoy and the
      videos run: 'online' (the one actors act with) or 'target' (with Polyak targets an
      average of the online network over the last ~1/tau SGD steps, so its greedy policy
      flips less often between evaluations; it costs nothing: the learner keeps it anyway).
    noisy: NoisyNet head(s) (factorized Gaussian) instead of epsilon-greedy exploration;
      epsilon() is then 0.
    noisy_sigma0: initial noise scale sigma0 of the noisy layers (0.5 in Rainbow).
    data: what it learns from: n-step transitions in a replay and the replay ratio
      (``ReplayConfig``; shown among the agent's flags, ``--agent.n-step``).
  """

  torso: Literal["auto", Torso] = "auto"  # Literal flattens: auto, mlp, nature_cnn, minatar_cnn
  hidden_sizes: Sequence[int] = (128, 128)
  layer_norm: bool = False
  learning_rate: float = 1e-3
  learning_rate_end: float = 0.0
  learning_rate_decay_steps: int = 0
  adam_eps: float = 1e-8
  max_grad_norm: float = 10.0
  batch_size: int = 128
  # Unions: each variant carries only the settings it uses, so a combination without a
  # meaning (Maxmin over C51, a copy period beside Polyak averaging) cannot be written.
  loss: DQNLoss = dataclasses.field(default_factory=QLearning)
  target_update: TargetUpdate = dataclasses.field(default_factory=Polyak)
  dueling: bool = False
  eps_start: float = 1.0
  eps_end: float = 0.05
  eps_decay_steps: int = 10_000
  exploration: Literal["schedule", "apex"] = "schedule"
  apex_epsilon: float = 0.4
  apex_alpha: float = 7.0
  eval_epsilon: float = 0.0
  evaluate: Literal["online", "target"] = "online"
  noisy: bool = False
  noisy_sigma0: float = 0.5
  data: Annotated[ReplayConfig, tyro.conf.arg(name="")] = dataclasses.field(
      default_factory=ReplayConfig)

  def validate(self) -> None:
    check_torso_fields(self.torso, self.hidden_sizes)
    if self.batch_size < 1:
      raise ConfigError(f"batch_size must be >= 1, got {self.batch_size}.")
    self.loss.validate()
    self.target_update.validate()
    if not (0.0 <= self.eps_end <= 1.0 and 0.0 <= self.eps_start <= 1.0
            and 0.0 <= self.eval_epsilon <= 1.0):
      raise ConfigError("eps_start and eps_end must be in [0, 1], and so must eval_epsilon.")
    if self.evaluate not in ("online", "target"):
      raise ConfigError(f"evaluate must be 'online' or 'target', got {self.evaluate!r}.")
    if self.exploration not in ("schedule", "apex"):
      raise ConfigError(f"exploration must be 'schedule' or 'apex', got {self.exploration!r}.")
    if self.exploration == "apex" and self.noisy:
      raise ConfigError("exploration='apex' adds an epsilon ladder on top of noisy nets; use "
                        "exploration='schedule' (noisy agents explore through their noise).")
    if not 0.0 < self.learning_rate < float("inf"):  # (also refuses NaN)
      raise ConfigError(f"learning_rate must be a finite number > 0, got {self.learning_rate}.")
    if not (self.learning_rate_end >= 0 and self.learning_rate_decay_steps >= 0):
      raise ConfigError(
          f"learning_rate_end={self.learning_rate_end}, learning_rate_decay_steps="
          f"{self.learning_rate_decay_steps}: need learning_rate_end >= 0 and "
          "learning_rate_decay_steps >= 0 (0: a constant learning rate).")
    if self.noisy and not self.noisy_sigma0 >= 0.0:
      raise ConfigError(f"noisy_sigma0 must be >= 0, got {self.noisy_sigma0}.")
    self.data.validate(self.batch_size)


def rainbow_replay(**changes: Any) -> ReplayConfig:
  """Rainbow's data (Hessel et al. 2018): 3-step returns into a proportional prioritized
  replay (priority exponent 0.5, importance exponent 0.4 annealed to 1); ``changes`` set the
  rest of the ``ReplayConfig`` (capacity, warmup, replay ratio) or override these."""
  return ReplayConfig(**{"n_step": 3, "prioritized": True, "priority_alpha": 0.5,
                         "priority_beta": 0.4, **changes})


def rainbow_config(v_min: float, v_max: float, data: ReplayConfig | None = None,
                   **changes: Any) -> DQNConfig:
  """Rainbow (Hessel et al. 2018) as a ``DQNConfig``, its six components on: double Q and C51
  with 51 atoms over ``[v_min, v_max]`` (the ``Categorical`` loss), a dueling head, noisy nets
  (sigma0 0.5), and ``rainbow_replay``'s n-step returns and prioritized replay (``data``: one
  built by ``rainbow_replay(...)`` with the run's sizes), with hard target copies
  (``HardCopy``; its period in ``changes``, as the other fields: sizes, learning rate)."""
  return DQNConfig(**{"loss": Categorical(double_q=True, num_atoms=51, v_min=v_min, v_max=v_max),
                      "dueling": True, "noisy": True, "noisy_sigma0": 0.5,
                      "target_update": HardCopy(), "data": rainbow_replay() if data is None
                      else data, **changes})


@flax.struct.dataclass
class DQNState(LearnerState):
  """The learner's state: ``LearnerState``'s params, opt_state, opt_steps (SGD steps) and key
  (the update's noise, noisy nets: split per SGD step), the target network's params, and
  ``value_bound``: float32 scalar, the largest value any sampled item's segment supports so far
  (``dqn_losses.value_bound``, at least 0: an ended episode's value), at which the targets are
  clipped; 0 before the first SGD step and for a loss that bounds nothing. A pytree
  (checkpointed leaf by leaf, keyed by field name, so their order is free)."""

  target_params: PyTree
  value_bound: jnp.ndarray

  # Checkpoints saved before value_bound existed load with its initial value: the maximum
  # rebuilds itself from the first batch (checkpoint.restore_checkpoint).
  leaves_added_later: ClassVar[tuple[str, ...]] = (".value_bound",)


def learning_rate_schedule(config: DQNConfig) -> optax.ScalarOrSchedule:
  """Adam's step size: constant, or annealed linearly to ``learning_rate_end`` over
  ``learning_rate_decay_steps`` SGD steps (``optimizers.learning_rate_schedule``)."""
  return optimizers.learning_rate_schedule(config.learning_rate, config.learning_rate_end,
                                           config.learning_rate_decay_steps)


def check_discrete_q_spaces(obs_space: gym.Space, action_space: gym.Space, env_id: str) -> None:
  """Raises ``ConfigError`` unless the spaces suit a discrete-action Q-learner."""
  if not isinstance(action_space, gym.spaces.Discrete):
    raise ConfigError(
        f"{env_id} has action space {action_space}; DQN/Rainbow need a Discrete action space. "
        "Use a discrete env, or a continuous-control algorithm.")
  check_box_observations(obs_space, env_id, "DQN")


class DQN(EpsilonGreedyActing, Agent):
  """DQN with the loss ``config.loss`` (double Q, Munchausen, C51; Maxmin ensembles) and
  optional dueling and noisy heads, for Box observations and Discrete actions.

  Args:
    config: hyperparameters.
    obs_space: one sub-env's observation space (a ``Box``).
    action_space: one sub-env's action space (``Discrete``).
  """

  def __init__(self, config: DQNConfig, obs_space: gym.Space, action_space: gym.Space,
               env_id: str = "the env"):
    check_discrete_q_spaces(obs_space, action_space, env_id)
    config.validate()
    check_torso(config.torso, obs_space.shape, env_id)
    self.keep_config(config, obs_space, action_space)
    self.num_actions = int(action_space.n)
    torso = (default_torso(obs_space.shape, obs_space.dtype) if config.torso == "auto"
             else config.torso)
    network_cls = QNetwork
    if config.loss.num_q_networks > 1:
      # N networks in one call: params and outputs get a leading axis of N.
      network_cls = nn.vmap(QNetwork, variable_axes={"params": 0},
                            split_rngs={"params": True, "noise": True}, in_axes=None,
                            out_axes=0, axis_size=config.loss.num_q_networks)
    self.network = network_cls(
        num_actions=self.num_actions,
        torso=torso,
        hidden_sizes=tuple(config.hidden_sizes), layer_norm=config.layer_norm,
        dueling=config.dueling,
        num_atoms=config.loss.num_atoms, noisy=config.noisy, sigma0=config.noisy_sigma0)
    # A categorical head's atoms (None for expected Q), computed here, outside jit, once.
    self.support = config.loss.support()
    self.optimizer = optimizers.adam_with_clipping(
        config.learning_rate, config.adam_eps, config.max_grad_norm,
        config.learning_rate_decay_steps, config.learning_rate_end)
    self.greedy_actions = jax.jit(self._greedy_actions)
    self.noisy_greedy_actions = jax.jit(self._noisy_greedy_actions)
    self._jitted_update = jax.jit(self._update, donate_argnums=0)

  # --- init / params -------------------------------------------------------
  def init(self, key: chex.PRNGKey) -> DQNState:
    """The initial state; ``key`` (``jax.random.PRNGKey``) seeds the params and the update noise."""
    # numpy: jnp.zeros would warn of a float64 space (MuJoCo's) that JAX truncates anyway.
    obs = np.zeros((1,) + self.obs_space.shape, self.obs_space.dtype)
    params = self.network.init(key, obs, True)  # deterministic (positional: nn.vmap drops kwargs)
    return DQNState(params=params, target_params=jax.tree.map(jnp.copy, params),
                    opt_state=self.optimizer.init(params), opt_steps=jnp.zeros((), jnp.int32),
                    key=key_data(jax.random.fold_in(key, 1)),
                    value_bound=jnp.zeros((), jnp.float32))

  @staticmethod
  def policy_params(state: DQNState) -> PyTree:
    """The part of the state actors need."""
    return state.params

  def evaluation_params(self, state: DQNState) -> PyTree:
    """The online network's params, or the target network's (``DQNConfig.evaluate``)."""
    return state.target_params if self.config.evaluate == "target" else state.params

  def epsilon(self, env_steps: int) -> float:
    """The exploration schedule's epsilon; 0 for noisy agents (the noise explores)."""
    return 0.0 if self.config.noisy else super().epsilon(env_steps)

  # --- acting --------------------------------------------------------------
  def apply(self, params: PyTree, obs: jnp.ndarray, key: chex.PRNGKey | None = None) -> jnp.ndarray:
    """The network's output (``[N, ...]`` with ``num_q_networks`` N > 1); a noisy network draws
    its noise from ``key``, or uses its mean weights when ``key`` is None (a non-noisy network
    ignores ``key``)."""
    if not self.config.noisy:
      return self.network.apply(params, obs)
    if key is None:
      return self.network.apply(params, obs, True)  # deterministic
    return self.network.apply(params, obs, rngs={"noise": key})

  def q_values(self, params: PyTree, obs: jnp.ndarray,
               key: chex.PRNGKey | None = None) -> jnp.ndarray:
    """Expected Q-values ``[B, A]`` (noisy nets: with noise from ``key``, else the mean
    network); the minimum over the networks when there are several."""
    return self.config.loss.expected_q(self.apply(params, obs, key), self.support)

  def _greedy_actions(self, params: PyTree, obs: jnp.ndarray) -> jnp.ndarray:
    """Argmax of Q; for noisy nets, of the mean (noise-free) network."""
    return jnp.argmax(self.q_values(params, obs), axis=-1).astype(jnp.int32)

  def _noisy_greedy_actions(self, params: PyTree, obs: jnp.ndarray,
                            seed: jnp.ndarray) -> jnp.ndarray:
    """Argmax of Q under one noise sample drawn from the integer ``seed``."""
    key = jax.random.PRNGKey(seed)
    return jnp.argmax(self.q_values(params, obs, key), axis=-1).astype(jnp.int32)

  def policy(self, params: PyTree, obs: np.ndarray, rng: np.random.Generator,
             explore: bool = True) -> np.ndarray:
    """The network's greedy actions ``[B]`` (before epsilon): one jitted call on ``params``'
    device.

    For a noisy agent, ``explore=True`` acts greedily under a fresh noise sample (its seed
    drawn from ``rng``) and ``explore=False`` under the mean network (evaluation);
    ``explore`` does nothing for a non-noisy agent.
    """
    if self.config.noisy and explore:
      seed = np.uint32(rng.integers(2 ** 31))
      return np.asarray(self.noisy_greedy_actions(params, obs, seed))
    return np.asarray(self.greedy_actions(params, obs))

  def training_epsilons(self, context: ActorContext) -> np.ndarray | None:
    """With ``exploration='apex'``, the actor's slice of the run's Ape-X ladder (sub-env
    ``i`` of actor ``a`` is rung ``a * num_envs + i``) ``[num_envs]``; else the schedule."""
    c = self.config
    if c.exploration != "apex":
      return None
    ladder = apex_epsilons(context.num_envs * context.num_actors, c.apex_epsilon, c.apex_alpha)
    start = context.actor_id * context.num_envs
    return ladder[start:start + context.num_envs]

  def divergence_hint(self) -> str:
    return (f"Lower the learning rate (now {self.config.learning_rate:g}), e.g. 10x, or check "
            "the env's rewards and observations for NaN or huge values.")

  def overestimation_hint(self) -> str:
    lr = f"a lower learning rate (now {self.config.learning_rate:g})"
    return f"Try {lr}." if self.config.layer_norm else f"Try layer_norm=True or {lr}."

  # --- learning ------------------------------------------------------------
  def loss(self, params: PyTree, target_params: PyTree, batch: Transition,
           weights: jnp.ndarray, key: chex.PRNGKey | None = None,
           value_bound: jnp.ndarray | None = None
           ) -> tuple[jnp.ndarray, tuple[jnp.ndarray, dict]]:
    """Importance-weighted loss over a batch ``[B]``; aux: per-item priorities ``[B]`` and metrics.

    Runs the forward passes ``config.loss`` reads (``QOutputs``) and weights its per-item
    losses, the targets clipped at ``value_bound`` (a scalar; None: not clipped). Noisy nets:
    ``key`` is split into independent noise for online(obs), online(next_obs) and
    target(next_obs) (Munchausen's target(obs) shares the target's); ``None`` uses the mean
    networks.
    """
    c, loss_fn = self.config, self.config.loss
    k_tm1 = k_t = k_target = None
    if c.noisy and key is not None:
      k_tm1, k_t, k_target = jax.random.split(key, 3)
    online_tm1 = self.apply(params, batch.obs, k_tm1)
    target_t, target_tm1 = self._forward_pair(target_params, batch.next_obs, batch.obs,
                                              k_target, k_target,
                                              both=loss_fn.needs_target_at_obs)
    # Double Q: the online network selects the bootstrap action; else the target network.
    selector_t = (jax.lax.stop_gradient(self.apply(params, batch.next_obs, k_t))
                  if loss_fn.double_q else target_t)
    terms = loss_fn(QOutputs(online_tm1, selector_t, target_t, target_tm1, self.support), batch,
                    value_bound)
    loss = jnp.mean(weights * terms.per_item)
    q_tm1 = jax.lax.stop_gradient(loss_fn.expected_q(online_tm1, self.support))
    metrics = {"loss": loss, "q_mean": terms.q_mean, **greedy_q_metrics(q_tm1)}
    if terms.target_clipped is not None:
      metrics["target_clipped"] = terms.target_clipped
    return loss, (jax.lax.stop_gradient(terms.priority), metrics)

  def _forward_pair(self, params: PyTree, obs_a: jnp.ndarray, obs_b: jnp.ndarray,
                    key_a: chex.PRNGKey | None, key_b: chex.PRNGKey | None, both: bool
                    ) -> tuple[jnp.ndarray, jnp.ndarray | None]:
    """``(apply(params, obs_a), apply(params, obs_b))``, the second only when ``both``.

    Both in one call on the concatenated batch ``[2B]``, one chain of kernels instead of two
    (every layer, LayerNorm included, acts on each item alone, so the outputs are the same):
    for the target network, which needs no gradient (~3 % of a LayerNorm MLP's SGD step on a
    2-core CPU; the online network's pair is slower concatenated, its backward pass then
    spanning both halves). Noisy networks with a key are applied twice, with ``key_a`` and
    ``key_b``.
    """
    if not both:
      return self.apply(params, obs_a, key_a), None
    if self.config.noisy and key_a is not None:
      return self.apply(params, obs_a, key_a), self.apply(params, obs_b, key_b)
    out = self.apply(params, jnp.concatenate([obs_a, obs_b]), key_a)
    axis = 1 if self.config.loss.num_q_networks > 1 else 0  # the batch axis ([N, 2B, ...])
    return tuple(jnp.split(out, 2, axis=axis))

  def _sgd_step(self, state: DQNState, inputs) -> tuple[DQNState, tuple]:
    batch, weights = inputs
    c = self.config
    key, noise_key = state.key, None
    if c.noisy:
      key, noise_key = jax.random.split(state.key)
    # The bound grows with every batch's segments: every stored item is sampled many times
    # over, so it soon is the replay's own maximum (the items' order does not matter).
    segment_bound = c.loss.segment_bound(batch, self.num_actions)
    # (A state restored from the previous release may hold less than 0: the segments' floor
    # lifts it at the first batch.)
    bound = (state.value_bound if segment_bound is None
             else jnp.maximum(state.value_bound, jnp.max(segment_bound)))
    grads, (priority, metrics) = jax.grad(self.loss, has_aux=True)(
        state.params, state.target_params, batch, weights, noise_key,
        None if segment_bound is None else bound)
    updates, opt_state = self.optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    opt_steps = state.opt_steps + 1
    target = c.target_update(params, state.target_params, opt_steps)
    metrics["grad_norm"] = optax.tree.norm(grads)
    if c.noisy:
      metrics["noise_sigma_mean"] = _mean_abs_sigma(params)
    return DQNState(params=params, target_params=target, opt_state=opt_state,
                    opt_steps=opt_steps, key=key, value_bound=bound), (priority, metrics)

  def update(self, state: DQNState, batch: Transition, weights: jnp.ndarray | None = None
             ) -> tuple[DQNState, dict, jnp.ndarray]:
    """``k`` SGD steps over ``batch`` (leaves ``[k, B, ...]``), jitted, ``state`` donated.

    Returns the new state, metrics averaged over the ``k`` steps, and the new priorities
    ``[k, B]`` (|TD error|, or the C51 cross-entropy) as the data source's feedback.
    """
    return self._jitted_update(state, batch, weights)

  def _update(self, state: DQNState, batch: Transition,
              weights: jnp.ndarray | None = None) -> tuple[DQNState, dict, jnp.ndarray]:
    """``k`` SGD steps over ``batch`` with leaves ``[k, B, ...]``.

    Returns the new state, metrics averaged over the ``k`` steps, and priorities ``[k, B]``.
    """
    if weights is None:
      weights = jnp.ones(batch.reward.shape, jnp.float32)
    state, (priority, metrics) = jax.lax.scan(self._sgd_step, state, (batch, weights))
    return state, jax.tree.map(jnp.mean, metrics), priority


def _mean_abs_sigma(params: PyTree) -> jnp.ndarray:
  """Mean ``|sigma|`` over the noisy layers' ``sigma_*`` leaves (how much noise is left)."""
  flat = jax.tree_util.tree_flatten_with_path(params)[0]
  sigmas = [jnp.abs(x).ravel() for path, x in flat
            if str(getattr(path[-1], "key", "")).startswith("sigma_")]
  return jnp.mean(jnp.concatenate(sigmas)) if sigmas else jnp.zeros(())


def greedy_q_metrics(q: jnp.ndarray) -> dict[str, jnp.ndarray]:
  """Health figures of a batch's Q-values ``q`` ``[B, A]`` (expected Q; the minimum over an
  ensemble's networks), as scalars:

  * ``action_gap``: the median over the batch of ``Q(s, a_1) - Q(s, a_2)``, the best action's
    value minus the second best's: how far the greedy action is from flipping (0 with one
    action);
  * ``q_max``: ``max_b max_a Q(s_b, a)``, to compare with the replay's ``q_bound``.
  """
  if q.shape[-1] < 2:
    gap = jnp.zeros((), q.dtype)
  else:
    # (a sort along the actions, not top_k: top_k made a sharded learner gather the batch's Q)
    top2 = jnp.sort(q, axis=-1)[:, -2:]  # [B, 2], ascending
    gap = jnp.median(top2[:, 1] - top2[:, 0])
  return {"action_gap": gap, "q_max": jnp.max(q)}
