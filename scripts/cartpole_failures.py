"""How a CartPole run's saved policy ends its episodes: the pole's angle or the cart's position.

  python scripts/cartpole_failures.py RUN_DIR        # the final checkpoint, 10 episodes
  python scripts/cartpole_failures.py RUN_DIR --checkpoint best --episodes 20

Restores the checkpoint's evaluation params as `python -m jaxasync.enjoy` does (the network the
run's config evaluates), plays --episodes episodes of CartPole-v1 with its evaluation policy
(any agent: DQN's greedy actions, an actor-critic's mode; env seeds --seed, --seed + 1, ...)
and prints, per episode, its length and how it ended: "angle" (|theta| > 12 degrees),
"position" (|x| > 2.4) or "time limit", with the cart's position and the pole's angle at the
end and the largest |x| on the way. A policy that balances but drifts off the
track fails differently from one whose balance breaks down; the two call for different
fixes.
"""

import argparse
from pathlib import Path

import gymnasium as gym
import numpy as np

from jaxasync import enjoy
from jaxasync.agent import ActorContext

X_LIMIT, THETA_LIMIT = 2.4, 12 * 2 * np.pi / 360  # gymnasium's CartPole-v1 thresholds


def ending(obs: np.ndarray, terminated: bool) -> str:
  """How an episode whose last observation is ``obs`` ``[4]`` (x, x_dot, theta, theta_dot)
  ended: "angle", "position" or "time limit" (not terminated: truncated)."""
  if not terminated:
    return "time limit"
  return "angle" if abs(obs[2]) > THETA_LIMIT else "position"


def episode_endings(run_dir: Path, checkpoint: str = "final", episodes: int = 10,
                    seed: int = 1000) -> list[dict]:
  """CartPole-v1 episodes of the run's checkpoint, its evaluation policy acting (env seeds
  ``seed``, ``seed + 1``, ...): per episode its length, ``ending``, last x and theta and
  largest |x|."""
  record = enjoy.load_record(run_dir)
  factory = enjoy.eval_factory(record, None)
  agent, params, _ = enjoy.restore_agent(record, enjoy.checkpoint_dir(run_dir, checkpoint),
                                         factory)
  rng = np.random.default_rng(seed)
  env = gym.make("CartPole-v1")
  rows = []
  for episode in range(episodes):
    obs, _ = env.reset(seed=seed + episode)
    actor_state = agent.initial_actor_state(ActorContext(num_envs=1, evaluation=True))
    length, max_x = 0, 0.0
    while True:
      action, _, actor_state = agent.act(params, obs[None], actor_state, rng, explore=False)
      obs, _, terminated, truncated, _ = env.step(int(action[0]))
      length, max_x = length + 1, max(max_x, abs(float(obs[0])))
      if terminated or truncated:
        break
    rows.append({"length": length, "ending": ending(obs, terminated), "x": float(obs[0]),
                 "theta": float(obs[2]), "max_abs_x": max_x})
  return rows


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("run_dir")
  parser.add_argument("--checkpoint", default="final", help="final, best or a step")
  parser.add_argument("--episodes", type=int, default=10)
  parser.add_argument("--seed", type=int, default=1000)
  args = parser.parse_args()
  rows = episode_endings(Path(args.run_dir), args.checkpoint, args.episodes, args.seed)
  for i, row in enumerate(rows):
    print(f"episode {i}: {row['length']} steps, {row['ending']} (x {row['x']:+.2f}, theta "
          f"{row['theta']:+.3f}, largest |x| {row['max_abs_x']:.2f})")
  ends = [row["ending"] for row in rows]
  print(", ".join(f"{ends.count(e)} {e}" for e in ("angle", "position", "time limit")))


if __name__ == "__main__":
  main()
