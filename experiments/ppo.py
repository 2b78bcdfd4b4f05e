"""PPO, synchronous or asynchronous (Sebulba-style), on any gymnasium env with Box observations
and Discrete actions.

  python experiments/ppo.py                         # CartPole-v1, one actor process
  python experiments/ppo.py --mode sync --seed 3    # lock-step: every unroll from the newest params
  python experiments/ppo.py --agent.num-epochs 4 --agent.num-minibatches 4
  python experiments/ppo.py --help                  # every flag

The tuned defaults, the reasons for them and the flags are in jaxasync/train/ppo.py, which
``python -m jaxasync.train ppo`` runs too (for an installed package).
"""

from jaxasync.train.ppo import *  # noqa: F401,F403  (Args, main and the presets, for importers)
from jaxasync.train.ppo import cli

if __name__ == "__main__":
  cli()
