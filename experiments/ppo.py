"""PPO, synchronous or asynchronous (Sebulba-style), on any gymnasium env with Box observations
and Discrete actions (a categorical policy) or a bounded one-axis Box of actions (a diagonal
Gaussian, its samples clipped to the Box).

  python experiments/ppo.py                         # --preset cartpole: CartPole-v1, async
  python experiments/ppo.py --mode sync --seed 3    # lock-step: unrolls from the newest params
  python experiments/ppo.py --agent.num-epochs 4 --agent.num-minibatches 4
  python experiments/ppo.py --preset pendulum       # RL Zoo's Pendulum-v1 settings
  python experiments/ppo.py --preset mujoco         # CleanRL's MuJoCo settings, HalfCheetah-v5
  python experiments/ppo.py --preset mujoco --env-id Hopper-v5
  python experiments/ppo.py --preset mujoco --help  # every flag, with that preset's defaults
  python experiments/ppo.py --preset minatar --env-id MinAtar/SpaceInvaders-v1  # gymnax-blines'

The tuned defaults, the reasons for them and the flags are in jaxasync/train/ppo.py, which
``python -m jaxasync.train ppo`` runs too (for an installed package).
"""

if __name__ == "__main__":  # JAX imports for seconds: a Ctrl-C then ends in one line
  import _quiet_start
  _quiet_start.while_importing()
from jaxasync.train.ppo import *  # noqa: F401,F403  (Args, main and the presets, for importers)
from jaxasync.train.ppo import cli

if __name__ == "__main__":
  _quiet_start.imported()  # (run_cli takes Ctrl-C from here)
  cli()
