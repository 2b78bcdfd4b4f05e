"""SBX's SAC or TD3 (stable-baselines-jax) on a gymnasium env, for side-by-side comparisons
with ``experiments/sac.py`` and ``experiments/td3.py`` on the same machine. Not a dependency of
jaxasync: run it from its own virtualenv (``pip install sbx-rl "gymnasium[mujoco]"``, the same
jax version).

  python scripts/peer_sbx.py --algo sac --env-id HalfCheetah-v5 --steps 300000 --seed 0
  python scripts/peer_sbx.py --algo td3 --env-id Hopper-v5 --steps 300000 --seed 1

SAC: RL Zoo's settings for SAC on HalfCheetah (its hyperparams/sac.yml: SBX's defaults,
256x256, Adam 3e-4, batch 256, 1M replay, tau 0.005, gamma 0.99, one SGD step per env step,
alpha tuned) with learning_starts 10,000 (``--learning-starts``).
TD3: the settings of ``experiments/td3.py --preset mujoco`` (the TD3 authors' repository's):
256x256 ReLU networks, Adam 3e-4, batch 256, 1M replay, tau 0.005, gamma 0.99, policy delay
2, target noise 0.2 clipped at 0.5, Gaussian exploration noise 0.1, one SGD step per env step,
and 25,000 uniform random env steps first (``--learning-starts 25000``), so that the two
differ in their implementation only.
Every ``--eval-every`` env steps: 10 deterministic episodes on a separate env, and the wall
seconds of training so far (evaluations excluded). Prints one JSON object: evaluations as
[env steps, wall s, mean return].
"""

from __future__ import annotations

import argparse
import json
import time

import gymnasium as gym
import numpy as np
from sbx import SAC, TD3
from stable_baselines3.common.noise import NormalActionNoise
from stable_baselines3.common.callbacks import BaseCallback


LEARNING_STARTS = {"sac": 10_000, "td3": 25_000}  # uniform random env steps first, per algo


def evaluate(model, env_id: str, episodes: int, seed: int) -> float:
  env = gym.make(env_id)
  returns = []
  for i in range(episodes):
    obs, _ = env.reset(seed=seed + 1000 + i)
    done, total = False, 0.0
    while not done:
      action, _ = model.predict(obs, deterministic=True)
      obs, reward, terminated, truncated, _ = env.step(action)
      total += float(reward)
      done = terminated or truncated
    returns.append(total)
  env.close()
  return float(np.mean(returns))


class Evaluations(BaseCallback):
  def __init__(self, env_id: str, every: int, episodes: int, seed: int):
    super().__init__()
    self.env_id, self.every, self.episodes, self.seed = env_id, every, episodes, seed
    self.points, self.train_s, self.since = [], 0.0, None

  def _on_training_start(self) -> None:
    self.since = time.perf_counter()

  def _on_step(self) -> bool:
    if self.num_timesteps % self.every == 0:
      self.train_s += time.perf_counter() - self.since
      ret = evaluate(self.model, self.env_id, self.episodes, self.seed)
      self.points.append([self.num_timesteps, round(self.train_s, 1), round(ret, 1)])
      print(json.dumps(self.points[-1]), flush=True)
      self.since = time.perf_counter()
    return True


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--algo", choices=("sac", "td3"), default="sac")
  p.add_argument("--env-id", default="HalfCheetah-v5")
  p.add_argument("--steps", type=int, default=300_000)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--learning-starts", type=int, default=None,
                 help="uniform random env steps first (default: 10,000 for SAC, 25,000 for TD3)")
  p.add_argument("--eval-every", type=int, default=10_000)
  p.add_argument("--eval-episodes", type=int, default=10)
  args = p.parse_args()
  env = gym.make(args.env_id)
  learning_starts = (LEARNING_STARTS[args.algo] if args.learning_starts is None
                     else args.learning_starts)
  if args.algo == "sac":
    model = SAC("MlpPolicy", env, seed=args.seed, verbose=0, learning_starts=learning_starts)
  else:
    actions = env.action_space.shape[-1]
    model = TD3("MlpPolicy", env, seed=args.seed, verbose=0, learning_starts=learning_starts,
                learning_rate=3e-4, batch_size=256, buffer_size=1_000_000, tau=0.005,
                gamma=0.99, policy_delay=2, target_policy_noise=0.2, target_noise_clip=0.5,
                train_freq=1, gradient_steps=1, policy_kwargs={"net_arch": [256, 256]},
                action_noise=NormalActionNoise(np.zeros(actions), 0.1 * np.ones(actions)))
  callback = Evaluations(args.env_id, args.eval_every, args.eval_episodes, args.seed)
  start = time.perf_counter()
  model.learn(total_timesteps=args.steps, callback=callback)
  print(json.dumps({"algo": args.algo, "env_id": args.env_id, "steps": args.steps,
                    "seed": args.seed, "wall_s_total": round(time.perf_counter() - start, 1),
                    "train_s": round(callback.train_s, 1), "evals": callback.points}))


if __name__ == "__main__":
  main()
