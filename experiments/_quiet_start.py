"""A Ctrl-C while an experiment script starts (JAX imports for seconds) ends in one line and
exit status 130, not a KeyboardInterrupt traceback. Imported before jaxasync: nothing heavy.
(``python -m jaxasync.train`` gets the same from ``jaxasync/__init__.py``.)"""

import os
import signal
import sys


def _interrupted(signum, frame):
  # An exit, not a KeyboardInterrupt: raised inside an import's weakref callback, an exception
  # is only printed and the import goes on.
  print("interrupted before training started", file=sys.stderr, flush=True)
  os._exit(130)


def while_importing() -> None:
  """Ctrl-C ends the process at once, with one line."""
  signal.signal(signal.SIGINT, _interrupted)


def imported() -> None:
  """Ctrl-C raises KeyboardInterrupt again (the run's loop stops on it, ``run_cli`` reports)."""
  signal.signal(signal.SIGINT, signal.default_int_handler)
