"""Rainbow (Hessel et al. 2018), synchronous or asynchronous, with every component switchable.

Rainbow = double Q + prioritized replay + dueling head + n-step returns + C51
distributional head + noisy nets (jaxasync.rainbow_config). All six are on by default; each
one turns off with a flag, C51 by choosing another loss (a subcommand, after every other
flag), so ablations are one flag away:

  python experiments/rainbow.py                           # --preset cartpole, CartPole-v1
  python experiments/rainbow.py --mode sync --seed 3 --target-eval-reward 475
  python experiments/rainbow.py --no-noisy                # epsilon-greedy instead of noisy nets
  python experiments/rainbow.py --n-step 1 --no-dueling --no-prioritized loss:q-learning --loss.no-double-q
  python experiments/rainbow.py loss:categorical --loss.no-double-q --loss.num-atoms 21
  python experiments/rainbow.py --preset minatar          # MinAtar Breakout, CPU-sized
  python experiments/rainbow.py --preset minatar --env-id MinAtar/SpaceInvaders-v1
  python experiments/rainbow.py --preset atari            # Dopamine-style Atari (ALE/Pong-v5)
  python experiments/rainbow.py --preset atari --env-id ALE/Breakout-v5 --atari-backend ale_vector
  python experiments/rainbow.py --preset cartpole --help  # every flag, with that preset's defaults

A preset only sets defaults: any flag given after it overrides them. Logs, checkpoints and
<logdir>/summary.json go under --logdir, as with experiments/dqn.py. The presets, the reasons
for them and the flags are in jaxasync/train/rainbow.py (``python -m jaxasync.train rainbow``).
"""

if __name__ == "__main__":  # JAX imports for seconds: a Ctrl-C then ends in one line
  import _quiet_start
  _quiet_start.while_importing()
from jaxasync.train.rainbow import *  # noqa: F401,F403  (Args, parse, the presets, for importers)
from jaxasync.train.rainbow import cli

if __name__ == "__main__":
  _quiet_start.imported()  # (run_cli takes Ctrl-C from here)
  cli()
