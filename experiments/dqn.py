"""DQN, synchronous or asynchronous, on any gymnasium env with Box observations and Discrete actions.

  python experiments/dqn.py                         # CartPole-v1, the default arrangement
  python experiments/dqn.py --mode sync --seed 3
  python experiments/dqn.py --mode thread --num-actors 2
  python experiments/dqn.py --agent.n-step 3 --agent.no-layer-norm
  python experiments/dqn.py --seed 3 agent.loss:q-learning --agent.loss.num-q-networks 2
  python experiments/dqn.py agent.target-update:hard-copy --agent.target-update.period 500
  python experiments/dqn.py --preset minatar --env-id MinAtar/Asterix-v1   # Revisiting Rainbow's DQN
  python experiments/dqn.py --help                  # every flag

The tuned defaults, the reasons for them and the flags are in jaxasync/train/dqn.py, which
``python -m jaxasync.train dqn`` runs too (for an installed package).
"""

if __name__ == "__main__":  # JAX imports for seconds: a Ctrl-C then ends in one line
  import _quiet_start
  _quiet_start.while_importing()
from jaxasync.train.dqn import *  # noqa: F401,F403  (Args, main and the presets, for importers)
from jaxasync.train.dqn import cli

if __name__ == "__main__":
  _quiet_start.imported()  # (run_cli takes Ctrl-C from here)
  cli()
