"""The frame-deduplicated replay returns exactly what StepProcessor + ReplayBuffer would store.

A synthetic env emits random small frames, random float rewards and episodes ending by
termination or truncation; FrameStackObservation stacks them (moved to the last axis,
as AtariEnvFactory does). The same steps feed (a) the plain StepProcessor, whose every
transition is kept, and (b) FrameStepProcessor + a small FrameReplayBuffer that wraps
around many times. After every add, the set of live slots is compared with the set of
naive transitions that should be available, and each one field by field.
"""

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

from jaxasync.collectors.frames import PAD, STEP, FrameRecords, FrameStepProcessor
from jaxasync.collectors.nstep import StepProcessor
from jaxasync.replay import ReplayBuffer
from jaxasync.replay.frames import FrameReplayBuffer, PrioritizedFrameReplayBuffer
from jaxasync.types import Transition, transition_example

GAMMA = 0.9
FRAME = (6, 5)


class RandomFrameEnv(gym.Env):
  """Random uint8 frames and float rewards; episodes of 1..max_len steps end by termination
  or truncation at random."""

  observation_space = gym.spaces.Box(0, 255, FRAME, np.uint8)
  action_space = gym.spaces.Discrete(3)

  def __init__(self, max_len: int = 12):
    self.max_len = max_len

  def _frame(self):
    return self.np_random.integers(0, 256, FRAME, dtype=np.uint8)

  def reset(self, *, seed=None, options=None):
    super().reset(seed=seed)
    self._t, self._len = 0, int(self.np_random.integers(1, self.max_len + 1))
    self._truncate = bool(self.np_random.random() < 0.5)
    return self._frame(), {}

  def step(self, action):
    self._t += 1
    end = self._t >= self._len
    reward = float(self.np_random.normal()) + float(action)
    return self._frame(), reward, end and not self._truncate, end and self._truncate, {}


def make_env(num_envs: int, stack: int, padding: str) -> gym.vector.VectorEnv:
  def one():
    env = gym.wrappers.FrameStackObservation(RandomFrameEnv(), stack, padding_type=padding)
    space = gym.spaces.Box(0, 255, FRAME + (stack,), np.uint8)
    return gym.wrappers.TransformObservation(env, lambda o: np.moveaxis(o, 0, -1), space)
  return gym.vector.SyncVectorEnv([one] * num_envs, autoreset_mode=AutoresetMode.NEXT_STEP)


def concat(parts):
  return type(parts[0])(*(np.concatenate(xs) for xs in zip(*parts)))


class Oracle:
  """Every naive transition, and which ones a frame buffer of ``capacity`` must hold.

  Record positions are counted here independently of the buffer: records are added in
  order, so the i-th record added has position i. Every observation stack is the stack of
  one record (the STEP record of the obs, or the TERMINATED / TRUNCATED record of a final
  obs). A naive transition is available iff the records of its ``obs`` and its ``next_obs``
  have been added, and the oldest record of its stack, ``(stream, seq - K + 1)``, is among
  the last ``capacity`` added.
  """

  def __init__(self, capacity: int, k: int):
    self.capacity, self.k = capacity, k
    self.naive: dict[bytes, Transition] = {}
    self.record_of: dict[bytes, tuple[int, int]] = {}  # stack bytes -> (stream, seq)
    self.pos_of: dict[tuple[int, int], int] = {}
    self.added = 0

  def on_step(self, obs: np.ndarray, next_obs: np.ndarray, records: FrameRecords,
              naive: Transition) -> None:
    for i in np.nonzero(records.kind != PAD)[0]:
      stream, seq = int(records.stream[i]), int(records.seq[i])
      e = stream & 0xFFFF
      stack = obs[e] if records.kind[i] == STEP else next_obs[e]
      self.record_of[stack.tobytes()] = (stream, seq)
    for i in range(naive.reward.shape[0]):
      t = Transition(**{f: getattr(naive, f)[i] for f in ("obs", "action", "reward",
                                                          "discount", "next_obs")})
      key = t.obs.tobytes()
      assert key not in self.naive  # random frames: keys are unique
      self.naive[key] = t

  def on_add(self, records: FrameRecords) -> None:
    for s, q in zip(records.stream.tolist(), records.seq.tolist()):
      self.pos_of[(s, q)] = self.added
      self.added += 1

  def expected(self) -> set[bytes]:
    lo = self.added - self.capacity
    out = set()
    for key, t in self.naive.items():
      stream, seq = self.record_of[key]
      oldest = self.pos_of.get((stream, seq - self.k + 1))
      if (oldest is not None and oldest >= lo and (stream, seq) in self.pos_of
          and self.record_of.get(t.next_obs.tobytes()) in self.pos_of):
        out.add(key)
    return out


def check_buffer(buf, oracle: Oracle, exact: bool = True) -> int:
  """Asserts the live transitions are the expected ones (a subset of them if not ``exact``),
  each equal to the naive one."""
  live = np.flatnonzero(buf.live)
  assert len(buf) == live.size
  got = {}
  if live.size:
    batch = buf.gather(live)
    for i in range(live.size):
      key = batch.obs[i].tobytes()
      assert key not in got
      got[key] = i
      want = oracle.naive.get(key)
      assert want is not None, "the frame buffer returned a transition the naive one never made"
      for f in ("obs", "action", "reward", "discount", "next_obs"):
        a, b = getattr(batch, f)[i], getattr(want, f)
        assert a.dtype == b.dtype and a.shape == b.shape, f
        np.testing.assert_array_equal(a, b, err_msg=f)
  if exact:
    assert set(got) == oracle.expected()
  else:
    assert set(got) <= oracle.expected()
  return live.size


def run_stream(replay_cls, n: int, k: int = 4, padding: str = "reset", num_actors: int = 2,
               num_envs: int = 3, chunk_steps: int = 3, capacity: int = 53, steps: int = 150,
               drop_every: int = 0, seed: int = 0, reward_clip: float = 0.0):
  """Feeds ``num_actors`` actors' interleaved chunks to the frame replay, checking after each."""
  envs = [make_env(num_envs, k, padding) for _ in range(num_actors)]
  example = transition_example(envs[0].single_observation_space, envs[0].single_action_space)
  buf = replay_cls(example, capacity, seed=seed)
  oracle = Oracle(capacity, k)
  rng = np.random.default_rng(seed)
  actors = []
  for i, env in enumerate(envs):
    obs, _ = env.reset(seed=seed + 100 * i)
    a_ex = np.asarray(env.single_action_space.sample())
    naive, frames = (StepProcessor(num_envs, obs[0], a_ex, n, GAMMA, reward_clip),
                     FrameStepProcessor(num_envs, obs[0], a_ex, n, GAMMA, reward_clip))
    naive.reset(obs)
    frames.reset(obs)
    actors.append((env, naive, frames, []))
  checked = max_live = chunks = 0
  for step in range(steps):
    for i in rng.permutation(num_actors):  # actors' chunks interleave in the replay
      env, naive, frames, pending = actors[i]
      actions = rng.integers(0, 3, num_envs)
      obs = frames.obs
      next_obs, reward, terminated, truncated, _ = env.step(actions)
      records = frames.step(actions, reward, next_obs, terminated, truncated)
      naive_out = naive.step(actions, reward, next_obs, terminated, truncated)
      np.testing.assert_array_equal(naive.obs, frames.obs)
      oracle.on_step(obs, next_obs, records, naive_out)
      pending.append(records)
      if len(pending) == chunk_steps:
        chunk = concat(pending)
        pending.clear()
        chunks += 1
        if drop_every and chunks % drop_every == 0:
          continue  # a chunk lost in transport: its records are never added
        oracle.on_add(chunk)
        buf.add(chunk)
        max_live = max(max_live, check_buffer(buf, oracle, exact=not drop_every))
        checked += 1
  return buf, oracle, checked, max_live


@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("padding", ["reset", "zero"])
def test_frame_replay_equals_naive(n, padding):
  buf, oracle, checked, max_live = run_stream(FrameReplayBuffer, n, padding=padding)
  assert checked > 90 and oracle.added > 5 * buf.capacity  # wrapped around many times
  assert max_live > buf.capacity // 3  # (short episodes: K records of overhead each)
  # Episodes ended both ways, and some transitions bootstrap past the window's end.
  discounts = np.array([float(t.discount) for t in oracle.naive.values()])
  assert (discounts == 0).any() and (discounts > 0).any()
  batch = buf.sample(len(buf))
  assert batch.obs.shape == (len(buf),) + FRAME + (4,) and batch.next_obs.shape == batch.obs.shape
  for i in range(len(buf)):
    assert batch.obs[i].tobytes() in oracle.naive


def test_frame_replay_equals_naive_with_reward_clipping():
  """Clipping each reward before the n-step sum gives the same transitions in both stores
  (the synthetic rewards, normal + action, often exceed 1); episode returns stay unclipped."""
  buf, oracle, checked, _ = run_stream(FrameReplayBuffer, 3, reward_clip=1.0)
  assert checked > 90
  rewards = np.array([float(t.reward) for t in oracle.naive.values()])
  assert 1.0 < rewards.max() <= 1.0 + GAMMA + GAMMA**2 + 1e-6  # sums of clipped rewards


def test_single_frame_observations_and_n_larger_than_episodes():
  run_stream(FrameReplayBuffer, n=12, k=1, capacity=40, steps=80)


def test_dropped_chunks_never_yield_wrong_transitions():
  # Lost chunks leave gaps in their streams: transitions whose records span a gap are never
  # live, and every live one still equals the naive transition.
  buf, oracle, _, max_live = run_stream(FrameReplayBuffer, n=3, drop_every=4, steps=120)
  assert max_live > buf.capacity // 3


def test_prioritized_frame_replay_tracks_live_slots():
  buf, oracle, _, _ = run_stream(PrioritizedFrameReplayBuffer, n=3, steps=80)
  priorities = buf.sum_tree.get(np.arange(buf.capacity))
  np.testing.assert_array_equal(priorities > 0, buf.live)
  batch, idx, weights, gens = buf.sample(len(buf))
  assert buf.live[idx].all() and weights.max() == pytest.approx(1.0)
  for i in range(len(idx)):
    assert batch.obs[i].tobytes() in oracle.naive
  assert buf.update_priorities(idx, np.full(len(idx), 5.0), gens) == len(idx)
  assert buf.max_priority == 5.0


def test_bytes_per_item_atari():
  space = gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)
  example = transition_example(space, gym.spaces.Discrete(6))
  stack = 84 * 84 * 4
  uniform = FrameReplayBuffer(example, 1000)
  prioritized = PrioritizedFrameReplayBuffer(example, 1024)
  assert uniform.bytes_per_item <= 1.05 * stack
  assert prioritized.bytes_per_item <= 1.05 * stack
  assert ReplayBuffer(example, 100).bytes_per_item > 2 * stack


def test_rejects_plain_transitions_and_mismatched_settings():
  space = gym.spaces.Box(0, 255, FRAME + (4,), np.uint8)
  example = transition_example(space, gym.spaces.Discrete(3))
  buf = FrameReplayBuffer(example, 10)
  with pytest.raises(ValueError, match="FrameRecords"):
    buf.add(Transition(*(v[None] for v in example[:5])))
  obs = np.zeros((2,) + FRAME + (4,), np.uint8)
  for n in (1, 2):
    proc = FrameStepProcessor(2, obs[0], np.int64(0), n_step=n)
    proc.reset(obs)
    records = proc.step(np.zeros(2, np.int64), np.zeros(2), obs, np.zeros(2, bool),
                        np.zeros(2, bool))
    if n == 1:
      buf.add(records)
    else:
      with pytest.raises(ValueError, match="n_step"):
        buf.add(records)


def test_processor_rejects_observations_that_are_not_frame_stacks():
  obs = np.zeros((1,) + FRAME + (4,), np.uint8)
  proc = FrameStepProcessor(1, obs[0], np.int64(0))
  proc.reset(obs)
  bad = obs.copy()
  bad[0, 0, 0, 1] = 7  # an older frame changed: not a shift by one frame
  with pytest.raises(ValueError, match="shifted"):
    proc.step(np.zeros(1, np.int64), np.zeros(1), bad, np.zeros(1, bool), np.zeros(1, bool))


def test_stream_ids_differ_between_processors():
  obs = np.zeros((4,) + FRAME + (4,), np.uint8)
  a = FrameStepProcessor(4, obs[0], np.int64(0)).streams
  b = FrameStepProcessor(4, obs[0], np.int64(0)).streams
  assert len(set(a.tolist()) | set(b.tolist())) == 8
