"""Settings for the whole test session."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

# Runs in the tests (and the actor processes and notebooks they start, which inherit the
# environment) keep their compiled programs in a directory of this session's, never in the
# user's ~/.cache/jaxasync/xla: JAX_COMPILATION_CACHE_DIR wins over --compile-cache
# (experiment.use_compile_cache). Every program is kept, as a run keeps them by default.
if not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
  _cache_dir = tempfile.mkdtemp(prefix="jaxasync-tests-xla-")
  os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache_dir
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  atexit.register(shutil.rmtree, _cache_dir, ignore_errors=True)
