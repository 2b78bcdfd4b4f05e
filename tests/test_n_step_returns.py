"""The one n-step return computation (collectors.returns.n_step_returns), against hand sums."""

import numpy as np
import pytest

from jaxasync.collectors.nstep import StepProcessor
from jaxasync.collectors.returns import n_step_returns

GAMMA = 0.5


def test_windows_ending_at_a_termination_a_truncation_and_a_full_window():
  # Three columns of the last T = 3 steps, rewards oldest first. Column 0's newest step
  # terminated, column 1's was truncated (a time limit), column 2's window is merely full.
  r_t = np.array([[1.0, 4.0, 7.0],
                  [2.0, 5.0, 8.0],
                  [3.0, 6.0, 9.0]])
  g_t, discount_t = n_step_returns(r_t, np.array([True, False, False]), GAMMA)
  # G[i] = r[i] + .5 r[i+1] + .25 r[i+2] + ..., through the newest step.
  np.testing.assert_array_equal(g_t, [[1 + 1 + .75, 4 + 2.5 + 1.5, 7 + 4 + 2.25],
                                      [2 + 1.5, 5 + 3, 8 + 4.5],
                                      [3, 6, 9]])
  # Termination: nothing bootstrapped. Truncation and a full window: gamma^(steps).
  np.testing.assert_array_equal(discount_t, [[0, .125, .125], [0, .25, .25], [0, .5, .5]])
  assert g_t.dtype == discount_t.dtype == np.float64


def test_older_rows_never_leak_into_newer_ones_and_negative_zero_is_zero():
  # Row 0 of column 0 is a step of an earlier episode (a caller drops that row): the rows
  # after it must not see it.
  r_t = np.array([[1e9, 1.0], [-0.0, 2.0], [-0.0, -0.0]])
  g_t, _ = n_step_returns(r_t, np.zeros(2, bool), GAMMA)
  np.testing.assert_array_equal(g_t[1:], [[0.0, 2.0], [0.0, 0.0]])
  assert not np.signbit(g_t[1:]).any()  # (as the gamma * 0 of an empty tail gives)


def test_one_step_windows():
  g_t, discount_t = n_step_returns(np.array([[2.0, -1.0]]), np.array([False, True]), 0.9)
  np.testing.assert_array_equal(g_t, [[2.0, -1.0]])
  np.testing.assert_array_equal(discount_t, [[0.9, 0.0]])


def test_bad_shapes_raise():
  with pytest.raises(ValueError, match="r_t"):
    n_step_returns(np.zeros(3), np.zeros(3, bool), GAMMA)
  with pytest.raises(ValueError, match="terminated"):
    n_step_returns(np.zeros((2, 3)), np.zeros(2, bool), GAMMA)


def test_step_processor_with_a_termination_and_a_truncation_inside_the_window():
  """One sub-env, n = 3: episode A terminates after 2 steps (rewards 1, 2), episode B is
  truncated after 4 (rewards 3, 4, 5, 6); every transition by hand."""
  proc = StepProcessor(1, np.zeros(1, np.float32), np.zeros((), np.int64), n_step=3,
                       gamma=GAMMA)
  # (observation, reward, terminated, truncated) of each env step; observations number
  # the states: A0 A1 A2 | B0 B1 B2 B3 B4 (A2 and B4 are final observations).
  a0, a1, a2, b0, b1, b2, b3, b4 = range(8)
  proc.reset(np.array([[a0]], np.float32))
  steps = [(a1, 1, False, False), (a2, 2, True, False),
           (b0, 0, False, False),  # autoreset step: makes no transition
           (b1, 3, False, False), (b2, 4, False, False), (b3, 5, False, False),
           (b4, 6, False, True)]
  out = []
  for obs, reward, term, trunc in steps:
    t = proc.step(np.zeros(1, np.int64), np.array([reward], np.float64),
                  np.array([[obs]], np.float32), np.array([term]), np.array([trunc]))
    out += [(int(t.obs[i, 0]), float(t.reward[i]), float(t.discount[i]), int(t.next_obs[i, 0]))
            for i in range(t.reward.shape[0])]
  assert out == [
      # A: the termination falls inside every window: short returns, no bootstrap.
      (a0, 1 + .5 * 2, 0.0, a2),
      (a1, 2.0, 0.0, a2),
      # B: a full window first, then the truncation inside the rest: bootstrap from B4.
      (b0, 3 + .5 * 4 + .25 * 5, .125, b3),
      (b1, 4 + .5 * 5 + .25 * 6, .125, b4),
      (b2, 5 + .5 * 6, .25, b4),
      (b3, 6.0, .5, b4),
  ]
