"""n-step returns: the one computation behind every n-step transition of the library.

``StepProcessor`` calls it on its ring of pending rewards at every step; the frame replay
(``jaxasync.replay.frames``) on the rewards it walks back through when a window completes.
Both therefore give the same float64 numbers, bit for bit, for the same steps.

Time indexing (as rlax): ``r_t[i]`` is the reward of the ``i``-th step of a window, the step
from observation ``i`` to observation ``i + 1``; the window's newest step is ``T - 1`` and
observation ``T`` is the one to bootstrap from.
"""

from __future__ import annotations

import functools

import numpy as np


def n_step_returns(r_t: np.ndarray, terminated: np.ndarray,
                   gamma: float) -> tuple[np.ndarray, np.ndarray]:
  """The returns and bootstrap discounts of every transition that ends at the newest step.

  Row ``i`` is the transition from observation ``i`` through step ``T - 1`` (``T - i``
  steps)::

    G_t[i] = r_t[i] + gamma * G_t[i + 1],   G_t[T] = 0   (Horner, from the newest reward)
    discount_t[i] = 0 if terminated else gamma ** (T - i)

  Episode ends: a transition never spans one (the callers only pass steps of one episode
  per column, so an end can only be the newest step). Terminated there: the final state is
  terminal, nothing is bootstrapped (discount 0). Truncated there (a time limit), or a
  window that is merely full: the return continues past the cut, so the transition
  bootstraps from observation ``T`` with ``gamma ** (T - i)``; pass ``terminated=False``.

  Rows of a column that belong to an earlier episode give values the caller must drop; they
  never leak into newer rows (the recursion runs from the newest step back).

  Args:
    r_t: ``[T, B]`` rewards, oldest step first (``r_t[T - 1]`` is the newest), ``T >= 1``.
    terminated: ``[B]`` bool, whether the newest step of each column ended its episode by
      termination.
    gamma: the discount in ``[0, 1]``.

  Returns:
    ``(G_t, discount_t)``, both ``[T, B]`` float64.
  """
  # (Plain checks: chex's cost ~10 us a call, half a vector step of a small env; this runs
  # on every actor step.)
  if r_t.ndim != 2 or r_t.shape[0] < 1 or np.shape(terminated) != r_t.shape[1:]:
    raise ValueError(f"n_step_returns takes r_t [T >= 1, B] and terminated [B]; got "
                     f"{r_t.shape} and {np.shape(terminated)}.")
  t_len = r_t.shape[0]
  g_t = np.empty(r_t.shape, np.float64)
  # ``+ 0.0``: the empty tail ``gamma * 0``, which also turns a reward of -0.0 into 0.0.
  acc = r_t[t_len - 1] + 0.0
  g_t[t_len - 1] = acc
  for i in range(t_len - 2, -1, -1):
    acc = r_t[i] + gamma * acc
    g_t[i] = acc
  discount_t = np.where(terminated, 0.0, _bootstrap_discounts(float(gamma), t_len)[:, None])
  return g_t, discount_t


@functools.lru_cache(maxsize=64)
def _bootstrap_discounts(gamma: float, t_len: int) -> np.ndarray:
  """``gamma ** (T - i)`` for ``i = 0 .. T - 1``, ``[T]`` float64 (read-only; cached: the
  callers ask for the same few at every step)."""
  powers = gamma ** np.arange(t_len + 1, dtype=np.float64)  # (as the table it replaces)
  out = powers[t_len:0:-1].copy()
  out.flags.writeable = False
  return out
