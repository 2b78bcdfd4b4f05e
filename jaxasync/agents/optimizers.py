"""The one optimizer builder every agent uses: Adam after global-norm clipping, its step size
constant or annealed linearly (optax's pieces, chained the same way for every agent, so an
optimizer state has one layout)."""

from __future__ import annotations

import optax


def learning_rate_schedule(learning_rate: float, learning_rate_end: float = 0.0,
                           decay_steps: int = 0) -> optax.ScalarOrSchedule:
  """``learning_rate``, or annealed linearly to ``learning_rate_end`` over ``decay_steps``
  optimizer steps, then held (counted by the optimizer state, so it survives checkpoints and
  runs inside a jitted ``k``-step scan); ``decay_steps <= 0``: constant."""
  if decay_steps <= 0:
    return learning_rate
  return optax.linear_schedule(learning_rate, learning_rate_end, decay_steps)


def adam_with_clipping(learning_rate: float, adam_eps: float, max_grad_norm: float,
                       decay_steps: int = 0, learning_rate_end: float = 0.0
                       ) -> optax.GradientTransformation:
  """Adam (``eps=adam_eps``) after global-norm clipping at ``max_grad_norm`` (none when it is
  0), its step size from ``learning_rate_schedule``."""
  clip = [optax.clip_by_global_norm(max_grad_norm)] if max_grad_norm else []
  lr = learning_rate_schedule(learning_rate, learning_rate_end, decay_steps)
  return optax.chain(*clip, optax.adam(lr, eps=adam_eps))
