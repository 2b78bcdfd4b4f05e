"""The learner state of agents with one network and one optimizer (PQN, DQN, IMPALA, PPO):
one definition, extended by the agents that keep more (``DQNState``'s target network,
``ActorCriticState``'s observation statistics, ``IMPALAState``'s target policy)."""

from __future__ import annotations

from typing import Any

import flax
import jax.numpy as jnp

PyTree = Any


@flax.struct.dataclass
class LearnerState:
  """Params, their optimizer's state, the steps taken and a PRNG key: a pytree (checkpointed
  leaf by leaf, keyed by field name, so a subclass's checkpoints keep these four keys).

  Attributes:
    params: the network's params.
    opt_state: the optimizer's state.
    opt_steps: int32 scalar: the agent's steps taken (SGD steps for DQN and IMPALA;
      iterations, each epochs x minibatches of SGD steps, for PPO and PQN).
    key: uint32[2] PRNG key data (PPO's and PQN's minibatch shuffles, DQN's noisy nets).
  """

  params: PyTree
  opt_state: PyTree
  opt_steps: jnp.ndarray
  key: jnp.ndarray
