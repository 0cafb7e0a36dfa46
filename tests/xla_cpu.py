"""The XLA flags the CPU test suite compiles under, and a jit that compiles as XLA does by default.

Compiling is most of the suite's time (its programs are small). XLA's CPU fusion emitters compile
a program about 2.4x slower than the older elemental emitters (a small layer's gradient: 0.46 s
against 0.19 s), so the suite turns them off. Both are exact to float rounding, but they round
and lay out buffers differently, so a test that compares two programs bit for bit, or a
program's temporaries against a bound, compiles with ``jit_xla_defaults`` (these flags back at
XLA's defaults).

Two more CPU-only flags cut the CPU time of the suite's processes: one LLVM module per program
(``xla_cpu_parallel_codegen_split_count=1``, not 32 compiled in parallel) and single-threaded
Eigen matmuls (``xla_cpu_multi_thread_eigen=false``). The suite's programs are small, and its two
workers already fill the machine's cores, so the threads mostly compete. Measured with ``-n 0``
(one process, CPU seconds): -14% (one module) and -9% (single-threaded Eigen) on
``test_parallel.py`` and ``test_layer.py``, and -5% to -9% for the two together over those plus
``test_fp8_mosaic.py`` and ``test_cli.py``. Single-threaded Eigen may sum a matmul in another
order than its threads do, so ``jit_xla_defaults`` sets both back too.

With the older emitters, XLA's CPU runtime let the simulated devices of the poisoned
token-dispatch program (ep=4, overflow windows) enter two collectives of one loop body in
different orders (devices 0 and 2 in an all-gather, 1 and 3 in an all-to-all: a rendezvous that
never completes; that test aborted in 5 runs of 7), so the poisoned programs compile at XLA's
defaults too. (Turning the concurrency-optimized scheduler off instead also cured it, but it
changes every program's buffers, and ``compiler_options`` cannot turn it back on.) CPU-only
runs: the GPU tests leave XLA's defaults alone.
"""

import os
import subprocess
import sys

FLAGS = ["--xla_force_host_platform_device_count=8", "--xla_backend_optimization_level=0"]
CPU_ONLY_FLAGS = [
    "--xla_cpu_use_fusion_emitters=false",
    "--xla_cpu_parallel_codegen_split_count=1",
    "--xla_cpu_multi_thread_eigen=false",
]
_XLA_DEFAULTS = {
    "xla_cpu_use_fusion_emitters": True,
    "xla_cpu_parallel_codegen_split_count": 32,
    "xla_cpu_multi_thread_eigen": True,
}


def _xla_knows(flags):
    """XLA aborts the process on a flag it does not know: try new flags in a child first."""
    env = dict(os.environ, XLA_FLAGS=" ".join(flags), JAX_PLATFORMS="cpu")
    probe = [sys.executable, "-c", "import jax; jax.devices()"]
    return subprocess.run(probe, env=env, capture_output=True).returncode == 0


def set_xla_flags():
    """Adds the suite's flags to ``XLA_FLAGS`` (before jax is imported); once per run, since
    pytest-xdist's workers inherit the controller's environment."""
    if "JAXMOE_TEST_XLA_FLAGS" in os.environ:
        return
    flags = list(FLAGS)
    if os.environ.get("JAX_PLATFORMS") == "cpu" and _xla_knows(CPU_ONLY_FLAGS):
        flags += CPU_ONLY_FLAGS
    for flag in flags:
        if flag.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
            os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()
    os.environ["JAXMOE_TEST_XLA_FLAGS"] = os.environ["XLA_FLAGS"]


def jit_xla_defaults(fun, **jit_kwargs):
    """``jax.jit`` with the CPU-only flags at XLA's defaults: for programs a test compares bit
    for bit, or whose temporaries it bounds."""
    import jax

    on = all(flag in os.environ.get("XLA_FLAGS", "").split() for flag in CPU_ONLY_FLAGS)
    options = _XLA_DEFAULTS if on else None
    return jax.jit(fun, compiler_options=options, **jit_kwargs)
