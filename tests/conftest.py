"""Every test sees 8 simulated CPU devices (set before jax is imported anywhere)."""

import os

# Once: pytest-xdist's workers inherit the controller's environment and import this file again.
if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
from hypothesis import settings  # noqa: E402

# CI (CI=true) draws the same examples every run, so a landing never hangs on a lucky draw;
# developers' runs keep drawing new ones.
settings.register_profile("ci", derandomize=True, database=None)
if os.environ.get("CI"):
    settings.load_profile("ci")

jax.config.update("jax_default_matmul_precision", "highest")
jax.config.update("jax_numpy_rank_promotion", "raise")
