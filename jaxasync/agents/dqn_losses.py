"""DQN's losses, one frozen dataclass per variant (acme's loss objects), chosen by
``DQNConfig.loss``:

  * ``QLearning``: expected-Q regression on the (double) Q-learning target, Huber loss;
  * ``Munchausen``: the same regression on the Munchausen-DQN target;
  * ``Categorical``: C51's cross-entropy to the projected target distribution.

The two expected-Q losses may regress an ensemble (``num_q_networks``, Maxmin Q-learning);
the categorical one has one network and no Huber threshold. A combination that has no
meaning (Maxmin over distributions, a Munchausen bonus on C51) is therefore not a setting.

Every loss object offers the same members, which the agent asks instead of probing:
  * ``double_q``: whether the online network selects the bootstrap action;
  * ``num_q_networks``, ``num_atoms``: the network head it needs (ensemble size, atoms per
    action; 1 and 1 for one expected-Q network);
  * ``needs_target_at_obs``: whether it reads the target network at ``obs`` too;
  * ``validate()``; ``support()``: the atoms' returns ``[Z]`` of a categorical head (None for
    an expected-Q one), which the agent computes once and passes back;
  * ``expected_q(out, support)``: a head's output -> expected Q-values ``[B, A]``;
  * ``segment_bound(batch, num_actions)``: per item ``[B]``, the largest value the item's
    segment supports (``value_bound``), or None for a loss whose targets need no bound;
  * calling it, ``loss(outputs, batch, value_bound)``: per-item loss, priority and mean Q of a
    batch (``LossTerms``), from the forward passes the agent ran (``QOutputs``), the target
    clipped at ``value_bound`` (a scalar, or None: no clip).
"""

from __future__ import annotations

import abc
import dataclasses
import math
from typing import ClassVar, NamedTuple

import chex
import jax
import jax.numpy as jnp
import rlax

from jaxasync.errors import ConfigError, check_positive
from jaxasync.types import Transition


class QOutputs(NamedTuple):
  """The network outputs a loss reads, for a batch of ``B`` transitions. Each is ``[B, A]``
  for one expected-Q network, ``[N, B, A]`` for an ensemble of ``N``, ``[B, A, Z]`` (logits)
  for a categorical head of ``Z`` atoms.

  Attributes:
    online_tm1: the online network at ``obs``: what is regressed (the gradient flows here).
    selector_t: at ``next_obs``, the outputs whose greedy action (or soft policy) is
      bootstrapped on: the online network's with ``double_q`` (no gradient), else ``target_t``.
    target_t: the target network at ``next_obs``: values the bootstrap action.
    target_tm1: the target network at ``obs``, for losses with ``needs_target_at_obs``;
      else None.
    support: a categorical head's atoms' returns ``[Z]`` (the loss's ``support()``, computed
      once by the agent); None for expected-Q heads.
  """

  online_tm1: jnp.ndarray
  selector_t: jnp.ndarray
  target_t: jnp.ndarray
  target_tm1: jnp.ndarray | None = None
  support: jnp.ndarray | None = None


class LossTerms(NamedTuple):
  """What a loss gives the agent for a batch of ``B`` transitions.

  Attributes:
    per_item: the loss of each transition ``[B]``, before importance weights.
    priority: each transition's new replay priority ``[B]`` (no gradient needed).
    q_mean: the mean expected Q-value at ``obs`` (a scalar metric).
    target_clipped: the fraction of the batch's targets above the value bound, clipped to
      it (a scalar metric); None without a bound.
  """

  per_item: jnp.ndarray
  priority: jnp.ndarray
  q_mean: jnp.ndarray
  target_clipped: jnp.ndarray | None = None


def _check_outputs(out: QOutputs, batch: Transition, rank: int, batch_axis: int) -> None:
  """The outputs share one shape of ``rank`` axes whose ``batch_axis`` is the batch's ``B``."""
  chex.assert_rank(out.online_tm1, rank)
  chex.assert_equal_shape([out.online_tm1, out.selector_t, out.target_t])
  chex.assert_rank([batch.action, batch.reward, batch.discount], 1)
  chex.assert_equal_shape([batch.action, batch.reward, batch.discount])
  chex.assert_axis_dimension(out.online_tm1, batch_axis, batch.reward.shape[0])


def munchausen_target(q_target_tm1: jnp.ndarray, a_tm1: jnp.ndarray, r_t: jnp.ndarray,
                      discount_t: jnp.ndarray, q_target_t: jnp.ndarray, tau: float,
                      alpha: float, clip: float,
                      q_selector_t: jnp.ndarray | None = None) -> jnp.ndarray:
  """The Munchausen-DQN target of one transition (Vieillard et al. 2020, eq. 2).

  ``y = r_t + alpha * clip(tau * log pi(a_tm1 | s_tm1), clip, 0)
  + discount_t * sum_a pi(a | s_t) (q_target_t[a] - tau * log pi(a | s_t))``, with
  ``pi = softmax(q_target / tau)`` the target network's soft policy.

  Args:
    q_target_tm1: target Q-values at ``s_tm1``, ``[A]``.
    a_tm1: the action taken, int scalar.
    r_t: the (n-step) return, scalar; the bonus is the first step's only.
    discount_t: the bootstrap discount (``gamma^n``, 0 at termination), scalar.
    q_target_t: target Q-values at the bootstrap state, ``[A]``.
    tau: softmax temperature (> 0).
    alpha: bonus scale in [0, 1].
    clip: lower bound ``l0 < 0`` of ``tau * log pi``.
    q_selector_t: Q-values ``[A]`` whose soft policy weights the bootstrap (double Q: the
      online network's); None: the target network's own, as in the paper.

  Returns:
    The target, a scalar (no gradient flows through it).
  """
  tau_log_pi_tm1 = tau * jax.nn.log_softmax(q_target_tm1 / tau)
  bonus = alpha * jnp.clip(tau_log_pi_tm1[a_tm1], clip, 0.0)
  log_pi_t = jax.nn.log_softmax((q_target_t if q_selector_t is None else q_selector_t) / tau)
  soft_value_t = jnp.sum(jnp.exp(log_pi_t) * (q_target_t - tau * log_pi_t))
  return jax.lax.stop_gradient(r_t + bonus + discount_t * soft_value_t)


def value_bound(reward: jnp.ndarray, discount: jnp.ndarray,
                bonus_per_bootstrap: float = 0.0) -> jnp.ndarray:
  """The largest value each n-step item's segment supports, ``[B]``:
  ``(r + discount * bonus) / (1 - discount)``, the value of the segment repeated forever
  (``bonus``: what a soft value adds at each bootstrap, e.g. Munchausen's entropy term at most
  ``tau * log(A)``), and at least 0: an episode that ends is worth 0 from there, so where every
  reward is negative (Acrobot's -1 per step) returns up to 0 are possible before the data shows
  a termination (a bound at the segments' -100 took away the initial values' optimism); the
  largest float32 where ``discount >= 1`` (an undiscounted task has no bound; finite, as the
  learner's state must be).

  The maximum over a set of items bounds every Q-value the Bellman operator on those items can
  reach: a target above it is an overestimate by construction. (The replay's ``q_bound``
  health figure is the same maximum over the whole replay, with no bonus, and ignores items
  with ``discount >= 1``.)

  Args:
    reward: the items' n-step rewards ``[B]``.
    discount: their bootstrap discounts ``[B]`` (0 at termination).
    bonus_per_bootstrap: the soft value's largest addition per bootstrap (>= 0).
  """
  chex.assert_equal_shape([reward, discount])
  bounded = discount < 1
  safe = jnp.where(bounded, 1.0 - discount, 1.0)
  return jnp.where(bounded, jnp.maximum((reward + discount * bonus_per_bootstrap) / safe, 0.0),
                   jnp.finfo(jnp.float32).max)


@dataclasses.dataclass(frozen=True)
class ExpectedQLoss(abc.ABC):
  """What the expected-Q losses share: a Huber regression of Q(obs, action) on a target that
  each subclass builds, for one network or a Maxmin ensemble (Lan et al. 2020).

  With N = num_q_networks networks the Q-value is their minimum, for acting, for selecting
  the bootstrap action and for valuing it; all networks are regressed on that one target every
  SGD step (the paper updates one, chosen at random, per step; 2 is discrete clipped double
  Q). The minimum counters the maximum's overestimation.

  Attributes:
    double_q: the online network selects the bootstrap action (Munchausen: its soft policy
      weights the soft value); off: the target network both selects and values it.
    num_q_networks: independently initialised Q-networks whose minimum is the Q-value.
    huber_delta: the Huber loss's threshold between its quadratic and linear parts.
    bound_targets: clip each target at the largest value the data sampled so far supports
      (the running maximum of ``segment_bound`` over every batch, at least 0, kept in the
      learner's state): no Q-value is regressed above what returns can be. Off by default, so
      that a config saved before the setting existed reruns as it ran; experiments/dqn.py
      turns it on.
  """

  double_q: bool = True
  num_q_networks: int = 1
  huber_delta: float = 1.0
  bound_targets: bool = False

  num_atoms: ClassVar[int] = 1  # one expected value per action
  needs_target_at_obs: ClassVar[bool] = False

  def validate(self) -> None:
    if self.num_q_networks < 1:
      raise ConfigError(f"num_q_networks must be >= 1, got {self.num_q_networks}.")
    check_positive(self, ("huber_delta",))  # (inf would make rlax's Huber loss NaN)

  def support(self) -> None:
    """None: an expected-Q head has no atoms."""
    return None

  def expected_q(self, out: jnp.ndarray, support: None = None) -> jnp.ndarray:
    """``[N, B, A]`` -> ``[B, A]``, the minimum over the networks; ``[B, A]`` passes through
    when there is one network."""
    return jnp.min(out, axis=0) if self.num_q_networks > 1 else out

  @abc.abstractmethod
  def target(self, out: QOutputs, batch: Transition) -> jnp.ndarray:
    """The regression target ``y`` ``[B]``."""

  def bonus_per_bootstrap(self, num_actions: int) -> float:
    """The most a bootstrapped value adds to the Q-values it is made of (0: a max or a
    greedy action's value)."""
    return 0.0

  def segment_bound(self, batch: Transition, num_actions: int) -> jnp.ndarray | None:
    """Per item ``[B]``, the largest value its segment supports (``value_bound``); None
    when ``bound_targets`` is off."""
    if not self.bound_targets:
      return None
    return value_bound(batch.reward, batch.discount, self.bonus_per_bootstrap(num_actions))

  def __call__(self, out: QOutputs, batch: Transition,
               value_bound: jnp.ndarray | None = None) -> LossTerms:
    """The loss of outputs ``[B, A]`` (``[N, B, A]`` for an ensemble) on a batch ``[B]``,
    the target clipped at ``value_bound`` (a scalar; None: not clipped).

    Per item: the Huber losses of the ``N`` networks' TD errors, summed over the networks (so
    each network's gradient is the one it would get alone; the global-norm clip then acts on
    all ``N`` together); priority: ``|TD|``, its mean over the networks.
    """
    ensemble = self.num_q_networks > 1
    _check_outputs(out, batch, rank=3 if ensemble else 2, batch_axis=1 if ensemble else 0)
    y = self.target(out, batch)
    clipped = None
    if value_bound is not None:
      chex.assert_rank(value_bound, 0)
      clipped = jnp.mean((y > value_bound).astype(jnp.float32))
      y = jnp.minimum(y, value_bound)
    q_tm1 = out.online_tm1 if ensemble else out.online_tm1[None]  # [N, B, A]
    action = batch.action.astype(jnp.int32)
    q_a = jnp.take_along_axis(q_tm1, action[None, :, None], -1)[..., 0]  # [N, B]
    td = jax.lax.stop_gradient(y)[None] - q_a
    return LossTerms(per_item=jnp.sum(rlax.huber_loss(td, self.huber_delta), axis=0),
                     priority=jnp.mean(jnp.abs(td), axis=0),
                     q_mean=jnp.mean(self.expected_q(out.online_tm1)),
                     target_clipped=clipped)


@dataclasses.dataclass(frozen=True)
class QLearning(ExpectedQLoss):
  """Q-learning on expected Q-values with a Huber loss (Mnih et al. 2015), double Q by
  default (van Hasselt et al. 2016); a Maxmin ensemble with num_q_networks > 1.

  Attributes:
    double_q: the online network selects the bootstrap action, the target network values
      it; off: the target network's maximum.
    num_q_networks: Q-networks whose minimum is the Q-value (Maxmin Q-learning); 1: one.
    huber_delta: the Huber loss's threshold between its quadratic and linear parts.
    bound_targets: clip each target at the largest value the data sampled so far supports:
      the running maximum over sampled items of (R + d * bonus) / (1 - d), R an item's
      n-step reward, d its bootstrap discount (bonus 0 here), and at least 0.
  """

  def target(self, out: QOutputs, batch: Transition) -> jnp.ndarray:
    """``y = r + discount * Q_target(s', argmax_a Q_selector(s', a))`` ``[B]``, the selector
    the online network (``double_q``) or the target network itself (the max-Q target)."""
    q_value_t = self.expected_q(out.target_t)  # [B, A]
    a_t = jnp.argmax(self.expected_q(out.selector_t), axis=-1)
    return batch.reward + batch.discount * jnp.take_along_axis(q_value_t, a_t[:, None], -1)[:, 0]


@dataclasses.dataclass(frozen=True)
class Munchausen(ExpectedQLoss):
  """Munchausen DQN (Vieillard et al. 2020): the target adds the scaled, clipped log-policy
  of the taken action and bootstraps on the soft value; a Huber loss, Maxmin optional.

  The bonus is an implicit KL penalty between successive policies (the paper), so an error in
  Q moves the greedy policy a little instead of flipping it.

  Attributes:
    double_q: the online network's softmax policy weights the soft value, the target network
      values it; off: the target network's own policy, as in the paper.
    num_q_networks: Q-networks whose minimum is the Q-value (Maxmin Q-learning); 1: one.
    huber_delta: the Huber loss's threshold between its quadratic and linear parts.
    bound_targets: clip each target at the largest value the data sampled so far supports:
      the running maximum over sampled items of (R + d * bonus) / (1 - d), R an item's
      n-step reward, d its bootstrap discount, bonus the soft value's entropy term at most,
      temperature * log(actions), and at least 0.
    alpha: scale of the log-policy bonus (0.9 in the paper).
    temperature: the softmax temperature tau, in return units (0.03 in the paper).
    clip: lower clip (< 0) of temperature * log pi (-1 in the paper).
  """

  alpha: float = 0.9
  temperature: float = 0.03
  clip: float = -1.0

  needs_target_at_obs: ClassVar[bool] = True

  def validate(self) -> None:
    super().validate()
    if not (self.temperature > 0 and 0 <= self.alpha <= 1 and self.clip < 0):
      raise ConfigError(
          f"Munchausen temperature={self.temperature}, alpha={self.alpha}, clip={self.clip}: "
          "need temperature > 0, 0 <= alpha <= 1 and clip < 0 (the paper's: 0.03, 0.9, -1).")

  def bonus_per_bootstrap(self, num_actions: int) -> float:
    """The soft value's entropy term, at most ``temperature * log(num_actions)`` (the bonus
    on the taken action is <= 0)."""
    return self.temperature * math.log(num_actions)

  def target(self, out: QOutputs, batch: Transition) -> jnp.ndarray:
    """``munchausen_target`` of each item ``[B]``: the target network's soft policy at
    ``obs`` (``target_tm1``) gives the bonus, once, for the first of the n steps."""
    chex.assert_equal_shape([out.online_tm1, out.target_tm1])
    q_selector_t = (jax.lax.stop_gradient(self.expected_q(out.selector_t)) if self.double_q
                    else None)
    return jax.vmap(munchausen_target, in_axes=(0, 0, 0, 0, 0, None, None, None, 0))(
        self.expected_q(out.target_tm1), batch.action.astype(jnp.int32), batch.reward,
        batch.discount, self.expected_q(out.target_t), self.temperature, self.alpha, self.clip,
        q_selector_t)


@dataclasses.dataclass(frozen=True)
class Categorical:
  """C51 (Bellemare et al. 2017): a return distribution per action over num_atoms atoms in
  [v_min, v_max], learnt by cross-entropy; the priority is that loss, as in Rainbow.

  Attributes:
    double_q: the online network's expected Q-values select the bootstrap action, the target
      network's distribution at it is the target; off: the target network selects too.
    num_atoms: atoms per action's distribution (51 in C51).
    v_min: the lowest return on the support.
    v_max: the highest return on the support.
  """

  double_q: bool = True
  num_atoms: int = 51
  v_min: float = -10.0
  v_max: float = 10.0

  num_q_networks: ClassVar[int] = 1
  needs_target_at_obs: ClassVar[bool] = False

  def validate(self) -> None:
    if self.num_atoms < 2 or not self.v_min < self.v_max:
      raise ConfigError(
          f"num_atoms={self.num_atoms}, v_min={self.v_min}, v_max={self.v_max}: need "
          "num_atoms >= 2 and v_min < v_max.")

  def support(self) -> jnp.ndarray:
    """The atoms' returns ``[Z]``, evenly spaced over ``[v_min, v_max]``. Call it outside
    ``jit`` (the agent does, once): ``jnp.linspace`` evaluated in a trace, even under
    ``ensure_compile_time_eval``, rounds some atoms differently (by an ulp)."""
    return jnp.linspace(self.v_min, self.v_max, self.num_atoms)

  def expected_q(self, logits: jnp.ndarray, support: jnp.ndarray) -> jnp.ndarray:
    """Logits ``[B, A, Z]`` -> expected Q-values ``[B, A]``, the distributions' means over
    ``support`` ``[Z]``."""
    return jnp.sum(jax.nn.softmax(logits, axis=-1) * support, axis=-1)

  def segment_bound(self, batch: Transition, num_actions: int) -> None:
    """None: the support ``[v_min, v_max]`` already bounds the targets."""
    return None

  def __call__(self, out: QOutputs, batch: Transition,
               value_bound: jnp.ndarray | None = None) -> LossTerms:
    """The loss of logits ``[B, A, Z]`` on a batch ``[B]`` (``value_bound`` must be None:
    the support bounds the targets): per item, the cross-entropy of
    the online distribution at the action to the target distribution at the bootstrap action,
    its atoms shifted to ``r + discount * z`` and projected back onto the support
    (``rlax.categorical_double_q_learning``); the priority is that cross-entropy (Hessel et
    al. 2018)."""
    _check_outputs(out, batch, rank=3, batch_axis=0)
    chex.assert_shape(out.support, (self.num_atoms,))
    assert value_bound is None, "C51's support bounds its targets; segment_bound is None"
    atoms = jnp.broadcast_to(out.support, (batch.reward.shape[0], self.num_atoms))
    q_select = self.expected_q(out.selector_t, out.support)
    per_item = jax.vmap(rlax.categorical_double_q_learning)(
        atoms, out.online_tm1, batch.action.astype(jnp.int32), batch.reward, batch.discount,
        atoms, out.target_t, q_select)
    return LossTerms(per_item=per_item, priority=per_item,
                     q_mean=jnp.mean(self.expected_q(out.online_tm1, out.support)))


# The field's type: one of these, each a subcommand on the command line (agent.loss:munchausen).
DQNLoss = QLearning | Munchausen | Categorical
