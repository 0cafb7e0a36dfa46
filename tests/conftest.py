"""Every test sees 8 simulated CPU devices (set before jax is imported anywhere)."""

import os
import shutil
import tempfile

from tests.xla_cpu import set_xla_flags

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The tests' programs are small, so compiling them is most of the suite's time: LLVM at -O0 saves
# about 30%, the CPU's older emitters 10-20% more (`tests/xla_cpu.py`). These change how
# the CPU code is optimised, which can move last bits (e.g. no fused multiply-adds); every test
# compares within a tolerance, or runs both sides under the same flags or `jit_xla_defaults`.
set_xla_flags()
# One XLA compilation cache for the whole run, made by the controller and shared by its
# workers: many tests compile the same program (a one-device reference, a layer config) through
# different function objects, which jit's in-memory cache cannot see (-16% on the EP tests).
_CACHE_ENV = "JAXMOE_TEST_COMPILATION_CACHE"
_OWNS_CACHE = _CACHE_ENV not in os.environ
if _OWNS_CACHE:
    os.environ[_CACHE_ENV] = tempfile.mkdtemp(prefix="jaxmoe-xla-cache-")

import jax  # noqa: E402
from hypothesis import settings  # noqa: E402

# CI (CI=true) draws the same examples every run, so a landing never hangs on a lucky draw;
# developers' runs keep drawing new ones.
settings.register_profile("ci", derandomize=True, database=None)
if os.environ.get("CI"):
    settings.load_profile("ci")

jax.config.update("jax_compilation_cache_dir", os.environ[_CACHE_ENV])
# Programs that compile in under 50 ms (most are single eager ops) cost more to write to the
# cache than to compile again: skipping them saved 7% of a four-file subset's CPU time.
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.05)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
jax.config.update("jax_default_matmul_precision", "highest")
jax.config.update("jax_numpy_rank_promotion", "raise")


def pytest_unconfigure(config):
    if _OWNS_CACHE and not hasattr(config, "workerinput"):  # the controller, after its workers
        shutil.rmtree(os.environ.pop(_CACHE_ENV), ignore_errors=True)
