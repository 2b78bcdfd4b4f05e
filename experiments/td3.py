"""TD3, synchronous or asynchronous, on any gymnasium env with Box observations and a bounded
one-axis Box of actions.

  python experiments/td3.py                          # --preset pendulum: Pendulum-v1
  python experiments/td3.py --mode sync --seed 3
  python experiments/td3.py --preset mujoco --env-id Hopper-v5   # the authors' repository's settings
  python experiments/td3.py --help                   # every flag

The presets, the reasons for them and the flags are in jaxasync/train/td3.py, which
``python -m jaxasync.train td3`` runs too (for an installed package).
"""

if __name__ == "__main__":  # JAX imports for seconds: a Ctrl-C then ends in one line
  import _quiet_start
  _quiet_start.while_importing()
from jaxasync.train.td3 import *  # noqa: F401,F403  (Args, main and the presets, for importers)
from jaxasync.train.td3 import cli

if __name__ == "__main__":
  _quiet_start.imported()  # (run_cli takes Ctrl-C from here)
  cli()
