"""PQN (Q(lambda), no replay, no target network), synchronous or asynchronous, on any gymnasium
env with Box observations and Discrete actions.

  python experiments/pqn.py                          # CartPole-v1, lock-step
  python experiments/pqn.py --mode process --seed 3  # one actor process that runs ahead
  python experiments/pqn.py --help                   # every flag

The tuned defaults, the reasons for them and the flags are in jaxasync/train/pqn.py, which
``python -m jaxasync.train pqn`` runs too (for an installed package).
"""

if __name__ == "__main__":  # JAX imports for seconds: a Ctrl-C then ends in one line
  import _quiet_start
  _quiet_start.while_importing()
from jaxasync.train.pqn import *  # noqa: F401,F403  (Args, main and the presets, for importers)
from jaxasync.train.pqn import cli

if __name__ == "__main__":
  _quiet_start.imported()  # (run_cli takes Ctrl-C from here)
  cli()
