"""Tests for the time-major unroll collector, against a scripted NEXT_STEP vector env."""

import chex
import numpy as np
import pytest

from jaxasync.collectors.unrolls import Unroll, UnrollCollector

B, T, A = 2, 3, 2


class ScriptedVecEnv:
  """Two sub-envs with gymnasium 1.x ``NEXT_STEP`` autoreset semantics.

  Sub-env ``e``'s observation is ``[e, episode, t]`` (``t`` = steps into the episode) and
  the reward of the step arriving at ``t`` is ``100 * e + t``. Sub-env 0 terminates after
  3 steps, sub-env 1 is truncated after 4. After a done step the next step ignores the
  action and returns the reset observation with ``autoreset_reward`` (gymnasium: 0) and
  terminated = truncated = False.
  """

  def __init__(self, lengths=(3, 4), truncates=(False, True), autoreset_reward=0.0):
    self.lengths, self.truncates, self.autoreset_reward = lengths, truncates, autoreset_reward
    self.applied_actions = []  # (step, env, action) of every non-ignored action

  def _obs(self):
    return np.array([[e, self.ep[e], self.t[e]] for e in range(B)], np.float32)

  def reset(self):
    self.ep, self.t, self.autoreset, self.steps = [0] * B, [0] * B, [False] * B, 0
    return self._obs()

  def step(self, action):
    reward, term, trunc = np.zeros(B), np.zeros(B, bool), np.zeros(B, bool)
    for e in range(B):
      if self.autoreset[e]:
        self.ep[e], self.t[e], self.autoreset[e] = self.ep[e] + 1, 0, False
        reward[e] = self.autoreset_reward
        continue
      self.applied_actions.append((self.steps, e, int(action[e])))
      self.t[e] += 1
      reward[e] = 100 * e + self.t[e]
      done = self.t[e] == self.lengths[e]
      term[e], trunc[e] = done and not self.truncates[e], done and self.truncates[e]
      self.autoreset[e] = done
    self.steps += 1
    return self._obs(), reward, term, trunc, {}


def _policy(s):
  """Step ``s``'s action ``10 s + e`` and extras (logits ``[s, e]``, value ``s + e / 10``)."""
  action = np.array([10 * s, 10 * s + 1], np.int32)
  extras = {"logits": np.array([[s, 0], [s, 1]], np.float32),
            "value": np.array([s, s + 0.1], np.float32)}
  return action, extras


def _collector(unroll_length=T, return_discount=None):
  return UnrollCollector(
      B, obs_example=np.zeros(3, np.float32), action_example=np.zeros((), np.int32),
      extras_example={"logits": np.zeros(A, np.float32), "value": np.zeros((), np.float32)},
      unroll_length=unroll_length, return_discount=return_discount)


def _run(steps, unroll_length=T, return_discount=None, **env_kwargs):
  """Unrolls emitted in ``steps`` steps, the collector and the env."""
  env, col = ScriptedVecEnv(**env_kwargs), _collector(unroll_length, return_discount)
  col.reset(env.reset())
  unrolls = []
  for s in range(steps):
    np.testing.assert_array_equal(col.obs, env._obs())
    action, extras = _policy(s)
    next_obs, reward, term, trunc, _ = env.step(action)
    out = col.step(action, reward, next_obs, term, trunc, extras)
    assert (out is not None) == ((s + 1) % unroll_length == 0)
    if out is not None:
      unrolls.append(out)
  return unrolls, col, env


# The whole timeline of 9 steps (timesteps 0..9), written out by hand; unroll k is rows
# 3k..3k+3. Columns: sub-env 0 (terminates at t = 3), sub-env 1 (truncated at t = 4).
OBS = np.array([  # (episode, t) per sub-env
    [(0, 0), (0, 0)], [(0, 1), (0, 1)], [(0, 2), (0, 2)], [(0, 3), (0, 3)],
    [(1, 0), (0, 4)], [(1, 1), (1, 0)], [(1, 2), (1, 1)], [(1, 3), (1, 2)],
    [(2, 0), (1, 3)], [(2, 1), (1, 4)]], np.float32)
OBS = np.concatenate([np.broadcast_to(np.array([0, 1], np.float32)[None, :, None],
                                      (10, 2, 1)), OBS], axis=-1)  # prepend the env id
REWARD = np.array([[0, 0], [1, 101], [2, 102], [3, 103], [0, 104],
                   [1, 0], [2, 101], [3, 102], [0, 103], [1, 104]], np.float32)
DISCOUNT = np.array([[1, 1], [1, 1], [1, 1], [0, 1], [1, 1],
                     [1, 1], [1, 1], [0, 1], [1, 1], [1, 1]], np.float32)
FIRST = np.array([[1, 1], [0, 0], [0, 0], [0, 0], [1, 0],
                  [0, 1], [0, 0], [0, 0], [1, 0], [0, 0]], bool)
LAST = np.array([[0, 0], [0, 0], [0, 0], [1, 0], [0, 1],
                 [0, 0], [0, 0], [1, 0], [0, 0], [0, 1]], bool)


def _expected(k):
  """Unroll ``k`` by hand: timeline rows 3k..3k+3, row 3's action/extras zero placeholders."""
  rows = slice(T * k, T * k + T + 1)
  steps = list(range(T * k, T * k + T))
  action = np.stack([_policy(s)[0] for s in steps] + [np.zeros(B, np.int32)])
  logits = np.stack([_policy(s)[1]["logits"] for s in steps] + [np.zeros((B, A), np.float32)])
  value = np.stack([_policy(s)[1]["value"] for s in steps] + [np.zeros(B, np.float32)])
  return Unroll(obs=OBS[rows], action=action, extras={"logits": logits, "value": value},
                reward=REWARD[rows], discount=DISCOUNT[rows], first=FIRST[rows],
                last=LAST[rows])


def test_shapes_and_dtypes():
  (u, *_), _, _ = _run(T)
  chex.assert_shape(u.obs, (T + 1, B, 3))
  chex.assert_shape(u.action, (T + 1, B))
  chex.assert_shape(u.extras["logits"], (T + 1, B, A))
  chex.assert_shape([u.extras["value"], u.reward, u.discount, u.first, u.last], (T + 1, B))
  assert u.obs.dtype == np.float32 and u.action.dtype == np.int32
  assert u.reward.dtype == np.float32 and u.discount.dtype == np.float32
  assert u.first.dtype == bool and u.last.dtype == bool


def test_unrolls_match_the_hand_written_timeline():
  unrolls, _, _ = _run(3 * T)
  assert len(unrolls) == 3
  for k, u in enumerate(unrolls):
    chex.assert_trees_all_equal(u, _expected(k))
  # A few entries spelled out, as the docstring reads them.
  np.testing.assert_array_equal(unrolls[0].obs[0], [[0, 0, 0], [1, 0, 0]])
  np.testing.assert_array_equal(unrolls[0].action[:, 1], [1, 11, 21, 0])
  np.testing.assert_array_equal(unrolls[1].reward[:, 1], [103, 104, 0, 101])


def test_the_running_discounted_return_by_hand_across_episode_ends_and_unroll_boundaries():
  """``return_discount`` 0.5 over the timeline above: ``R[t] = 0.5 R[t - 1] + reward[t]``,
  0 at each first timestep, continued from one unroll into the next; an env's reward at its
  autoreset step (7 here) counts nowhere."""
  by_hand = np.array([  # sub-env 0: rewards 0 1 2 3 | 0 1 2 3 | 0 1; sub-env 1: 0 101..104 | 0 101..
      [0, 0], [1, 101], [2.5, 152.5], [4.25, 179.25], [0, 193.625],
      [1, 0], [2.5, 101], [4.25, 152.5], [0, 179.25], [1, 193.625]], np.float32)
  unrolls, _, _ = _run(3 * T, return_discount=0.5, autoreset_reward=7.0)
  for k, u in enumerate(unrolls):
    np.testing.assert_allclose(u.discounted_return, by_hand[T * k:T * k + T + 1], rtol=1e-6)
    assert u.discounted_return.dtype == np.float32
    chex.assert_trees_all_equal(u._replace(discounted_return=None), _expected(k))
  # Not asked for: not tracked, and the unrolls are those of before.
  assert all(u.discounted_return is None for u in _run(3 * T)[0])
  with pytest.raises(ValueError, match="return_discount"):
    _collector(return_discount=1.5)


def test_consecutive_unrolls_share_their_boundary_timestep():
  unrolls, _, _ = _run(3 * T)
  for prev, nxt in zip(unrolls, unrolls[1:]):
    for field in ("obs", "reward", "discount", "first", "last"):
      np.testing.assert_array_equal(getattr(prev, field)[T], getattr(nxt, field)[0])
    # The boundary's action/extras: zero placeholders in prev, the real ones in nxt.
    np.testing.assert_array_equal(prev.action[T], [0, 0])
    np.testing.assert_array_equal(prev.extras["logits"][T], np.zeros((B, A)))
  np.testing.assert_array_equal(unrolls[1].action[0], [30, 31])
  np.testing.assert_array_equal(unrolls[1].extras["logits"][0], [[3, 0], [3, 1]])
  np.testing.assert_array_equal(unrolls[2].action[0], [60, 61])


def test_unroll_length_one():
  unrolls, _, _ = _run(5, unroll_length=1)
  assert len(unrolls) == 5
  for k, u in enumerate(unrolls):
    np.testing.assert_array_equal(u.obs, OBS[k:k + 2])
    np.testing.assert_array_equal(u.action, [_policy(k)[0], [0, 0]])
    np.testing.assert_array_equal(u.first, FIRST[k:k + 2])
    np.testing.assert_array_equal(u.last, LAST[k:k + 2])


def test_terminated_episode_inside_an_unroll():
  (_, u), _, env = _run(T * 2)  # timesteps 3..6; sub-env 0 terminated arriving at timestep 3
  # The action at a last timestep is the one the env ignores (its autoreset step).
  assert u.action[0, 0] == 30 and (3, 0, 30) not in env.applied_actions
  assert (2, 0, 20) in env.applied_actions
  np.testing.assert_array_equal(u.obs[0, 0], [0, 0, 3])  # the true final observation
  assert u.discount[0, 0] == 0.0 and u.last[0, 0] and not u.first[0, 0]
  np.testing.assert_array_equal(u.obs[1, 0], [0, 1, 0])  # the reset observation
  assert u.first[1, 0] and u.reward[1, 0] == 0.0 and u.discount[1, 0] == 1.0
  assert not u.last[1, 0]
  # Within the unroll of timesteps 6..9 the end falls strictly inside (at entry 1).
  u = _run(T * 3)[0][2]
  np.testing.assert_array_equal(u.discount[:, 0], [1, 0, 1, 1])
  np.testing.assert_array_equal(u.last[:, 0], [0, 1, 0, 0])
  np.testing.assert_array_equal(u.first[:, 0], [0, 0, 1, 0])
  np.testing.assert_array_equal(u.reward[:, 0], [2, 3, 0, 1])


def test_truncated_episode_keeps_discount_one_at_the_true_final_observation():
  u = _run(T * 2)[0][1]  # sub-env 1 truncated arriving at timestep 4 (entry 1)
  np.testing.assert_array_equal(u.obs[1, 1], [1, 0, 4])  # the true final observation
  assert u.last[1, 1] and u.discount[1, 1] == 1.0 and u.reward[1, 1] == 104.0
  np.testing.assert_array_equal(u.obs[2, 1], [1, 1, 0])
  assert u.first[2, 1] and u.reward[2, 1] == 0.0 and u.discount[2, 1] == 1.0
  np.testing.assert_array_equal(u.discount[:, 1], [1, 1, 1, 1])


def test_extras_pass_through_untouched():
  u = _run(T)[0][0]
  np.testing.assert_array_equal(
      u.extras["logits"], [[[0, 0], [0, 1]], [[1, 0], [1, 1]], [[2, 0], [2, 1]],
                           [[0, 0], [0, 0]]])
  np.testing.assert_allclose(u.extras["value"], [[0, 0.1], [1, 1.1], [2, 2.1], [0, 0]])
  assert u.extras["value"].dtype == np.float32


def test_episode_returns():
  env, col = ScriptedVecEnv(), _collector()
  col.reset(env.reset())
  returns = []
  for s in range(9):
    action, extras = _policy(s)
    next_obs, reward, term, trunc, _ = env.step(action)
    col.step(action, reward, next_obs, term, trunc, extras)
    returns.append(col.pop_episode_returns())
  # sub-env 0: 1 + 2 + 3 at steps 2 and 6; sub-env 1: 101 + ... + 104 at steps 3 and 8.
  assert returns == [[], [], [6.0], [410.0], [], [], [6.0], [], [410.0]]
  assert col.pop_episode_returns() == []


def test_autoreset_step_reward_is_ignored():
  """Whatever an env reports on its autoreset step, the timestep starts an episode."""
  unrolls, col, _ = _run(3 * T, autoreset_reward=7.0)
  for k, u in enumerate(unrolls):
    chex.assert_trees_all_equal(u, _expected(k))
  assert col.pop_episode_returns() == [6.0, 410.0, 6.0, 410.0]


def test_emitted_unrolls_do_not_alias_the_storage():
  env, col = ScriptedVecEnv(), _collector()
  col.reset(env.reset())
  unrolls, held_obs = [], None
  for s in range(3 * T):
    if s == 1:
      held_obs = col.obs  # later steps must not write into it
    action, extras = _policy(s)
    next_obs, reward, term, trunc, _ = env.step(action)
    out = col.step(action, reward, next_obs, term, trunc, extras)
    if out is not None:
      unrolls.append(out)
      if len(unrolls) == 1:  # scribbling on an emitted unroll must not reach later ones
        for leaf in (out.obs, out.reward, out.first, out.extras["logits"]):
          leaf[...] = 1
  np.testing.assert_array_equal(held_obs, OBS[1])
  chex.assert_trees_all_equal(unrolls[1], _expected(1))
  chex.assert_trees_all_equal(unrolls[2], _expected(2))
  # ... and later steps do not write into an emitted unroll.
  expected = _expected(0)
  chex.assert_trees_all_equal(
      unrolls[0], expected._replace(obs=np.ones_like(expected.obs),
                                    reward=np.ones_like(expected.reward),
                                    first=np.ones_like(expected.first),
                                    extras={**expected.extras,
                                            "logits": np.ones_like(expected.extras["logits"])}))


def test_reset_mid_unroll_starts_a_new_one():
  env, col = ScriptedVecEnv(), _collector()
  col.reset(env.reset())
  for s in range(2):
    action, extras = _policy(s)
    next_obs, reward, term, trunc, _ = env.step(action)
    assert col.step(action, reward, next_obs, term, trunc, extras) is None
  col.reset(env.reset())
  for s in range(T):
    action, extras = _policy(s)
    next_obs, reward, term, trunc, _ = env.step(action)
    out = col.step(action, reward, next_obs, term, trunc, extras)
  chex.assert_trees_all_equal(out, _expected(0))


def test_bad_arguments_raise():
  example = dict(obs_example=np.zeros(3, np.float32), action_example=np.zeros((), np.int32),
                 extras_example={"logits": np.zeros(A, np.float32)})
  with pytest.raises(ValueError, match="unroll_length"):
    UnrollCollector(B, unroll_length=0, **example)
  with pytest.raises(ValueError, match="num_envs"):
    UnrollCollector(0, unroll_length=T, **example)
  col = UnrollCollector(B, unroll_length=T, **example)
  zeros = np.zeros(B)
  ok = dict(action=np.zeros(B, np.int32), reward=zeros, next_obs=np.zeros((B, 3)),
            terminated=zeros, truncated=zeros, extras={"logits": np.zeros((B, A))})
  with pytest.raises(RuntimeError, match="before reset"):
    col.step(**ok)
  with pytest.raises(ValueError, match="obs"):
    col.reset(np.zeros((B, 4)))
  col.reset(np.zeros((B, 3)))
  bad = [dict(action=np.zeros((B, 1))), dict(next_obs=np.zeros((B + 1, 3))),
         dict(reward=np.zeros(B + 1)), dict(terminated=np.zeros(1)),
         dict(extras={"logits": np.zeros((B, A + 1))}), dict(extras={"value": zeros}),
         dict(extras=None)]
  for change in bad:
    with pytest.raises(ValueError, match=f"{next(iter(change))}|extras"):
      col.step(**{**ok, **change})
  assert col.step(**ok) is None  # the failed calls left no trace


def test_a_collector_pickled_before_return_tracking_resumes():
  """A lock-step run's checkpoint pickles its collector: one saved before
  ``return_discount`` existed loads, steps on, and tracks nothing."""
  import pickle
  unrolls, col, env = _run(2)
  for name in ("return_discount", "_ret", "_running_return"):
    del col.__dict__[name]
  old = pickle.loads(pickle.dumps(col))
  assert old.return_discount is None
  action, extras = _policy(2)
  next_obs, reward, term, trunc, _ = env.step(action)
  u = old.step(action, reward, next_obs, term, trunc, extras)
  assert u is not None and u.discounted_return is None
