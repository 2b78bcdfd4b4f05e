"""Tests for the n-step StepProcessor against gymnasium 1.x NEXT_STEP autoreset semantics."""

import collections

import chex
import numpy as np
import pytest

import jaxasync
from jaxasync.collectors.nstep import StepProcessor

GAMMA = 0.5

# Expected transitions of one episode, by (length, end, n), for rewards 1, 2, 3, ... and
# gamma = 0.5, worked out by hand. Each row: (start t, n-step reward, discount, next_obs t).
EXPECTED = {
    # Terminated after 4 steps: rewards 1, 2, 3, 4.
    (4, "term", 1): [(0, 1.0, 0.5, 1), (1, 2.0, 0.5, 2), (2, 3.0, 0.5, 3), (3, 4.0, 0.0, 4)],
    (4, "term", 3): [(0, 2.75, 0.125, 3),  # 1 + .5*2 + .25*3, window closes before the end
                     (1, 4.5, 0.0, 4),     # 2 + .5*3 + .25*4, terminal inside the window
                     (2, 5.0, 0.0, 4),     # 3 + .5*4, shorter than n
                     (3, 4.0, 0.0, 4)],
    (4, "term", 5): [(0, 3.25, 0.0, 4),    # 1 + 1 + .75 + .5, every one shorter than n
                     (1, 4.5, 0.0, 4), (2, 5.0, 0.0, 4), (3, 4.0, 0.0, 4)],
    # Truncated after 5 steps: rewards 1, 2, 3, 4, 5; bootstrap from the final obs (t=5).
    (5, "trunc", 1): [(0, 1.0, 0.5, 1), (1, 2.0, 0.5, 2), (2, 3.0, 0.5, 3), (3, 4.0, 0.5, 4),
                      (4, 5.0, 0.5, 5)],
    (5, "trunc", 3): [(0, 2.75, 0.125, 3),  # 1 + 1 + .75
                      (1, 4.5, 0.125, 4),   # 2 + 1.5 + 1
                      (2, 6.25, 0.125, 5),  # 3 + 2 + 1.25
                      (3, 6.5, 0.25, 5),    # 4 + 2.5, 2 real steps
                      (4, 5.0, 0.5, 5)],    # 1 real step
    (5, "trunc", 5): [(0, 3.5625, 0.03125, 5),  # 1 + 1 + .75 + .5 + .3125
                      (1, 5.125, 0.0625, 5),    # 2 + 1.5 + 1 + .625
                      (2, 6.25, 0.125, 5), (3, 6.5, 0.25, 5), (4, 5.0, 0.5, 5)],
    # Truncated after 2 steps (shorter than n = 3, 5).
    (2, "trunc", 1): [(0, 1.0, 0.5, 1), (1, 2.0, 0.5, 2)],
    (2, "trunc", 3): [(0, 2.0, 0.25, 2), (1, 2.0, 0.5, 2)],  # 1 + .5*2
    (2, "trunc", 5): [(0, 2.0, 0.25, 2), (1, 2.0, 0.5, 2)],
    # Terminated after a single step.
    (1, "term", 1): [(0, 1.0, 0.0, 1)],
    (1, "term", 3): [(0, 1.0, 0.0, 1)],
    (1, "term", 5): [(0, 1.0, 0.0, 1)],
}

# Episode schedules of the two sub-envs, cycled: (length, how it ends).
SCHEDULES = (
    [(4, "term"), (2, "trunc"), (5, "trunc")],
    [(5, "trunc"), (1, "term"), (4, "term"), (2, "trunc")],
)


def _action_code(env, episode, t):
  return 10_000 * env + 100 * episode + t


class FakeVectorEnv:
  """A lockstep vector env with scripted episodes and NEXT_STEP autoreset.

  Observation of sub-env ``e`` at step ``t`` of its episode ``k``: ``[e, k, t]``.
  The reward of step ``t`` is ``t + 1``. The step after a done step is an
  autoreset step: reward ``autoreset_reward`` (gymnasium: 0), not done, reset obs.
  """

  def __init__(self, schedules, autoreset_reward=0.0):
    self.schedules = schedules
    self.num_envs = len(schedules)
    self.autoreset_reward = autoreset_reward
    self.episode = np.zeros(self.num_envs, np.int64)
    self.t = np.zeros(self.num_envs, np.int64)
    self.autoreset = np.zeros(self.num_envs, bool)

  def obs(self):
    return np.stack([np.arange(self.num_envs), self.episode, self.t], axis=1).astype(np.float32)

  def policy(self):
    """Actions encoding (env, episode, t); autoreset steps get a garbage action."""
    return np.array([-7 if self.autoreset[e] else _action_code(e, self.episode[e], self.t[e])
                     for e in range(self.num_envs)], np.int64)

  def step(self):
    reward = np.zeros(self.num_envs, np.float32)
    terminated = np.zeros(self.num_envs, bool)
    truncated = np.zeros(self.num_envs, bool)
    for e in range(self.num_envs):
      if self.autoreset[e]:
        self.episode[e] += 1
        self.t[e] = 0
        self.autoreset[e] = False
        reward[e] = self.autoreset_reward
        continue
      reward[e] = self.t[e] + 1
      self.t[e] += 1
      length, end = self.schedules[e][self.episode[e] % len(self.schedules[e])]
      if self.t[e] == length:
        terminated[e], truncated[e] = end == "term", end == "trunc"
        self.autoreset[e] = True
    return reward, self.obs(), terminated, truncated


def _run(n, num_steps=40, autoreset_reward=0.0):
  """Drives a StepProcessor with the fake env; returns per-step outputs, steps and the env."""
  env = FakeVectorEnv(SCHEDULES, autoreset_reward)
  proc = StepProcessor(env.num_envs, np.zeros(3, np.float32), np.zeros((), np.int64), n, GAMMA)
  proc.reset(env.obs())
  outputs, steps = [], []
  for _ in range(num_steps):
    obs = proc.obs.copy()
    action = env.policy()
    reward, next_obs, terminated, truncated = env.step()
    steps.append((obs, action, reward, next_obs, terminated, truncated))
    outputs.append(proc.step(action, reward, next_obs, terminated, truncated))
  return outputs, steps, env


def _concat(outputs):
  return jax_tree_concat(outputs)


def jax_tree_concat(outputs):
  return jaxasync.Transition(**{
      k: np.concatenate([getattr(o, k) for o in outputs]) for k in
      ("obs", "action", "reward", "discount", "next_obs")})


@pytest.mark.parametrize("n", [1, 3, 5])
def test_hand_computed_n_step_transitions(n):
  outputs, _, env = _run(n)
  out = _concat(outputs)
  assert out.obs.dtype == np.float32 and out.next_obs.dtype == np.float32
  assert out.action.dtype == np.int64
  assert out.reward.dtype == np.float32 and out.discount.dtype == np.float32
  by_episode = collections.defaultdict(list)
  for i in range(out.reward.shape[0]):
    e, k, t = out.obs[i].astype(int)
    by_episode[(e, k)].append(i)
  checked = 0
  for e in range(env.num_envs):
    # Episodes finished within the run: everything before the current one (which
    # is finished too when its end was the very last step).
    finished = env.episode[e] + (1 if env.autoreset[e] else 0)
    for k in range(finished):
      length, end = SCHEDULES[e][k % len(SCHEDULES[e])]
      rows = by_episode.pop((e, k), [])
      assert len(rows) == length, (e, k)  # one transition per real step
      expected = EXPECTED[(length, end, n)]
      for i, (t, reward, discount, next_t) in zip(rows, expected):
        np.testing.assert_array_equal(out.obs[i], [e, k, t])
        assert out.action[i] == _action_code(e, k, t)
        assert out.reward[i] == reward, (e, k, t)
        assert out.discount[i] == discount, (e, k, t)
        np.testing.assert_array_equal(out.next_obs[i], [e, k, next_t])
        checked += 1
    # The unfinished episode only emitted its complete n-step windows so far.
    if not env.autoreset[e]:
      rows = by_episode.pop((e, env.episode[e]), [])
      assert len(rows) == max(0, env.t[e] - n + 1)
      for i, j in enumerate(rows):
        np.testing.assert_array_equal(out.obs[j], [e, env.episode[e], i])
        assert out.discount[j] == GAMMA ** n
  assert not by_episode  # nothing from anywhere else (e.g. autoreset steps)
  assert checked > 40


@pytest.mark.parametrize("n", [1, 3, 5])
def test_no_transition_straddles_episodes_and_order(n):
  outputs, _, _ = _run(n, num_steps=60)
  for out in outputs:
    # Same env and same episode at both ends.
    np.testing.assert_array_equal(out.obs[:, :2], out.next_obs[:, :2])
    # Real steps spanned: 1..n, consistent with the discount when bootstrapping.
    span = out.next_obs[:, 2] - out.obs[:, 2]
    assert np.all((span >= 1) & (span <= n))
    boot = out.discount > 0
    np.testing.assert_array_equal(out.discount[boot], GAMMA ** span[boot])
    # Within one call: by sub-env, then by start time.
    keys = [tuple(o) for o in out.obs[:, [0, 2]].astype(int)]
    assert keys == sorted(keys)
  # Across calls: each episode's transitions come out in start-time order.
  out = _concat(outputs)
  last = {}
  for o in out.obs.astype(int):
    key = (o[0], o[1])
    assert o[2] == last.get(key, -1) + 1
    last[key] = o[2]


def test_n1_equals_plain_one_step_transitions():
  outputs, steps, _ = _run(1, num_steps=50)
  for out, (obs, action, reward, next_obs, terminated, truncated) in zip(outputs, steps):
    real = obs[:, 2] < next_obs[:, 2]  # autoreset steps go back to t = 0
    np.testing.assert_array_equal(out.obs, obs[real])
    np.testing.assert_array_equal(out.action, action[real])
    np.testing.assert_array_equal(out.reward, reward[real])
    np.testing.assert_array_equal(out.discount, (GAMMA * (1 - terminated))[real])
    np.testing.assert_array_equal(out.next_obs, next_obs[real])


@pytest.mark.parametrize("n", [1, 3])
def test_autoreset_step_reward_and_action_are_ignored(n):
  clean = _concat(_run(n, num_steps=40)[0])
  noisy = _concat(_run(n, num_steps=40, autoreset_reward=1000.0)[0])
  chex.assert_trees_all_equal(clean, noisy)


def test_step_before_reset_and_bad_arguments_raise():
  proc = StepProcessor(2, np.zeros(3, np.float32), np.zeros((), np.int64), 3, GAMMA)
  with pytest.raises(RuntimeError, match="before reset"):
    proc.step(np.zeros(2, np.int64), np.zeros(2), np.zeros((2, 3)), np.zeros(2, bool),
              np.zeros(2, bool))
  with pytest.raises(ValueError, match="n_step must be >= 1"):
    StepProcessor(2, np.zeros(3), np.zeros(()), 0, GAMMA)
  with pytest.raises(ValueError, match=r"gamma must be in \[0, 1\]"):
    StepProcessor(2, np.zeros(3), np.zeros(()), 1, 1.5)


@pytest.mark.parametrize("n", [1, 3])
def test_reward_clip_clips_each_reward_before_the_n_step_sum(n):
  """Rewards 1, 2, 3, 4 then terminated, clip 1.5, gamma 0.5: the n-step returns sum the
  clipped rewards 1, 1.5, 1.5, 1.5 (clipping the sum instead would cap it at 1.5); the
  episode return is the unclipped 10."""
  proc = StepProcessor(1, np.zeros(2, np.float32), np.zeros((), np.int64), n, GAMMA,
                       reward_clip=1.5)
  proc.reset(np.zeros((1, 2), np.float32))
  outs = []
  for t, r in enumerate([1.0, 2.0, 3.0, 4.0]):
    outs.append(proc.step(np.array([0]), np.array([r]), np.full((1, 2), t + 1, np.float32),
                          np.array([t == 3]), np.array([False])))
  rewards = np.concatenate([o.reward for o in outs])
  expected = {1: [1.0, 1.5, 1.5, 1.5],
              3: [1.0 + 0.75 + 0.375, 1.5 + 0.75 + 0.375, 1.5 + 0.75, 1.5]}[n]
  np.testing.assert_allclose(rewards, expected)
  assert proc.pop_episode_returns() == [10.0]
  with pytest.raises(ValueError, match="reward_clip"):
    StepProcessor(1, np.zeros(2), np.zeros(()), n, GAMMA, reward_clip=-1.0)


def test_reset_clears_pending_steps():
  env = FakeVectorEnv(SCHEDULES)
  proc = StepProcessor(2, np.zeros(3, np.float32), np.zeros((), np.int64), 3, GAMMA)
  proc.reset(env.obs())
  for _ in range(2):  # two pending steps per env, nothing emitted yet
    action = env.policy()
    reward, next_obs, term, trunc = env.step()
    assert proc.step(action, reward, next_obs, term, trunc).reward.shape == (0,)
  proc.reset(env.obs())
  action = env.policy()
  reward, next_obs, term, trunc = env.step()
  out = proc.step(action, reward, next_obs, term, trunc)
  assert out.reward.shape == (0,)  # would be 2 windows of 3 without the reset


# --- real env vs an independent reference --------------------------------------
class NaiveNStep:
  """A straightforward per-env deque reference of n-step transitions (NEXT_STEP autoreset)."""

  def __init__(self, num_envs, n, gamma):
    self.n, self.gamma = n, gamma
    self.pending = [collections.deque() for _ in range(num_envs)]
    self.skip = [False] * num_envs

  def _emit(self, entries, next_obs, terminated):
    reward = 0.0
    for k, (_, _, r) in enumerate(entries):
      reward += self.gamma ** k * float(r)
    discount = 0.0 if terminated else self.gamma ** len(entries)
    obs, action, _ = entries[0]
    return (obs, action, np.float32(reward), np.float32(discount), next_obs)

  def step(self, obs, action, reward, next_obs, terminated, truncated):
    out = []
    for e, pending in enumerate(self.pending):
      if self.skip[e]:  # autoreset step: no transition
        self.skip[e] = False
        continue
      pending.append((obs[e].copy(), action[e], reward[e]))
      if terminated[e] or truncated[e]:
        while pending:
          out.append(self._emit(list(pending), next_obs[e].copy(), terminated[e]))
          pending.popleft()
        self.skip[e] = True
      elif len(pending) == self.n:
        out.append(self._emit(list(pending), next_obs[e].copy(), False))
        pending.popleft()
    return out


def _rows(transitions):
  """``[m, d]`` float64 rows (obs, action, reward, discount, next_obs) for sorting/comparing."""
  obs, action, reward, discount, next_obs = transitions
  return np.concatenate([obs, action[:, None], reward[:, None], discount[:, None], next_obs],
                        axis=1).astype(np.float64)


def _sorted(rows):
  return rows[np.lexsort(rows.T[::-1])] if len(rows) else rows


@pytest.mark.parametrize("max_episode_steps", [None, 12])
def test_matches_naive_reference_on_cartpole(max_episode_steps):
  kwargs = (("max_episode_steps", max_episode_steps),) if max_episode_steps else ()
  env = jaxasync.EnvFactory("CartPole-v1", kwargs=kwargs)(3, seed=0)
  n, num_steps = 3, 2000
  rng = np.random.default_rng(0)
  obs, _ = env.reset(seed=0)
  proc = StepProcessor(3, obs[0], np.asarray(env.single_action_space.sample()), n, GAMMA)
  proc.reset(obs)
  ref = NaiveNStep(3, n, GAMMA)
  ends = {"term": 0, "trunc": 0}
  emitted = 0
  try:
    for _ in range(num_steps):
      action = rng.integers(0, 2, size=3)
      next_obs, reward, terminated, truncated, _ = env.step(action)
      # Integer rewards 1..7 keep every n-step sum exact in float32 with gamma = 0.5.
      reward = reward * rng.integers(1, 8, size=3).astype(np.float32)
      out = proc.step(action, reward, next_obs, terminated, truncated)
      expected = ref.step(obs, action, reward, next_obs, terminated, truncated)
      got = _rows((out.obs, out.action, out.reward, out.discount, out.next_obs))
      want = (_rows(tuple(np.stack(x) for x in zip(*expected))) if expected
              else np.zeros((0, got.shape[1])))
      np.testing.assert_array_equal(_sorted(got), _sorted(want))
      np.testing.assert_array_equal(got, want)  # documented order: sub-env, then start time
      np.testing.assert_array_equal(proc.obs, next_obs)
      emitted += len(got)
      ends["term"] += int(terminated.sum())
      ends["trunc"] += int((truncated & ~terminated).sum())
      obs = next_obs
  finally:
    env.close()
  assert ends["term"] > 10
  if max_episode_steps:
    assert ends["trunc"] > 10
  assert emitted > 3 * num_steps * 0.8


@pytest.mark.parametrize("n_step", [1, 2])
def test_transitions_carry_the_extras_of_their_first_step(n_step):
  """One sub-env, episode: 3 real steps (terminated at the 3rd), then the autoreset step, then
  one more real step. The extras given with the action at step t are {"t": t, "pair": [t, -t]};
  each transition must carry its first step's (never the autoreset step's, t = 3)."""
  proc = StepProcessor(1, np.zeros(2, np.float32), np.zeros((), np.int64), n_step, 0.5,
                       extras_example={"t": np.float32(0), "pair": np.zeros(2, np.int32)})
  proc.reset(np.zeros((1, 2), np.float32))
  out = []
  for t, term in enumerate([False, False, True, False, False]):
    extras = {"t": np.array([t], np.float32), "pair": np.array([[t, -t]], np.int32)}
    out.append(proc.step(np.array([t]), np.array([1.0]), np.full((1, 2), t + 1, np.float32),
                         np.array([term]), np.array([False]), extras))
  firsts = np.concatenate([o.action for o in out]).tolist()  # each transition's first step
  got_t = np.concatenate([o.extras["t"] for o in out]).tolist()
  got_pair = np.concatenate([o.extras["pair"] for o in out]).tolist()
  # Step 3 is the autoreset step (no transition); with n = 2, step 4 has not closed a window.
  expected_firsts = [0, 1, 2, 4] if n_step == 1 else [0, 1, 2]
  assert firsts == expected_firsts
  assert got_t == [float(a) for a in expected_firsts]
  assert got_pair == [[a, -a] for a in expected_firsts]
  chex.assert_shape(out[0].extras["pair"], (len(out[0].action), 2))


def test_extras_without_an_extras_example_are_refused():
  proc = StepProcessor(1, np.zeros(2, np.float32), np.zeros((), np.int64))
  proc.reset(np.zeros((1, 2), np.float32))
  with pytest.raises(ValueError, match="extras_example"):
    proc.step(np.array([0]), np.array([1.0]), np.zeros((1, 2), np.float32), np.array([False]),
              np.array([False]), {"t": np.zeros(1, np.float32)})
