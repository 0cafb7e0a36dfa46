"""The worker of ``jaxmoe bench ab``: one long-lived process per source tree, run as a script.

The parent (:mod:`jaxmoe.bench.ab`) starts ``python -P ab_worker.py`` with ``PYTHONPATH`` set
to one tree's ``src``, so ``import jaxmoe`` here is *that tree's* jaxmoe (two trees cannot share
a process: their module names collide). Only the public API is called (``jaxmoe.grouped_matmul``,
``jaxmoe.fp8_grouped_matmul``, ``jaxmoe.ops.gated_grouped_matmul.gated_ffn``), which both trees
of a before/after comparison have; nothing of the tree's ``jaxmoe.bench`` is imported. The
timing helpers are this file's sibling ``timing.py`` (jax and the standard library only), loaded
by path under a name of its own.

The protocol: one JSON object per line on stdin, one reply per line on the original stdout
(``{"ok": true, ...}`` or ``{"ok": false, "error": "..."}``); anything else the process prints
goes to stderr, which the parent writes to a log. Commands (``op``):

- ``hello``: where jaxmoe was imported from, the versions, the device;
- ``build``: a case's inputs from its seed, its function jitted, run twice (``repeatable``: the
  two runs' bits agree; once with ``repeat: false``), each output leaf saved to
  ``save_dir/<leaf>.npy`` as its raw bits;
- ``warm``: warm-up calls; the number of back-to-back calls that fill ``target_sample_ms``;
- ``sample``: ``settle_ms`` untimed, then one timed sample of ``inner`` calls (ms per call);
- ``quit``.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import sys
import time
import traceback
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

DTYPE = jnp.bfloat16
UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
MAX_INNER = 1000


def load_timing():
    """The sibling ``timing.py`` as a module of its own name: ``jaxmoe.bench.timing`` would be
    the tree under test's (or missing from it)."""
    spec = importlib.util.spec_from_file_location(
        "jaxmoe_ab_timing", Path(__file__).with_name("timing.py")
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module


def hello() -> dict:
    import jaxmoe  # the tree's, found through PYTHONPATH

    device = jax.devices()[0]
    return {
        "jaxmoe_file": jaxmoe.__file__,
        "jaxmoe_version": getattr(jaxmoe, "__version__", None),
        "jax": jax.__version__,
        "jaxlib": importlib.metadata.version("jaxlib"),
        "numpy": np.__version__,
        "python": platform.python_version(),
        "platform": jax.default_backend(),
        "device": device.device_kind,
        "num_devices": jax.device_count(),
        "compute_capability": getattr(device, "compute_capability", None),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "pid": os.getpid(),
    }


def _normal(key, shape, scale: float = 1.0):
    return (jax.random.normal(key, shape, jnp.float32) * scale).astype(DTYPE)


def case_inputs(case: dict) -> tuple[dict, jax.Array]:
    """The case's operands (named) and its cotangent, drawn from ``case["seed"]``: ``x [M, K]``,
    weights scaled by 1/sqrt(fan-in), ``dy`` like the output."""
    m, k, n, g = case["m"], case["k"], case["n"], case["groups"]
    keys = jax.random.split(jax.random.key(case["seed"]), 5)
    x = _normal(keys[0], (m, k))
    if case["family"] == "gated_ffn":
        weights = {
            "w_gate": _normal(keys[1], (g, k, n), 1 / math.sqrt(k)),
            "w_up": _normal(keys[2], (g, k, n), 1 / math.sqrt(k)),
            "w_down": _normal(keys[3], (g, n, k), 1 / math.sqrt(n)),
        }
        return {"x": x, **weights}, _normal(keys[4], (m, k))
    return {"x": x, "w": _normal(keys[1], (g, k, n), 1 / math.sqrt(k))}, _normal(keys[4], (m, n))


def _gated_backend(name: str):
    if name == "pallas_fused":
        from jaxmoe.ops.gated_grouped_matmul.pallas_mosaic import PallasMosaicGatedGroupedMatmul

        return PallasMosaicGatedGroupedMatmul()
    return name


def case_op(case: dict):
    """``op(*operands, group_sizes)`` through the tree's public API, the case's backend."""
    import jaxmoe

    family, backend = case["family"], case["backend"]
    if family == "gmm":
        return lambda x, w, gs: jaxmoe.grouped_matmul(x, w, gs, backend=backend)
    if family == "gated_ffn":
        from jaxmoe.ops.gated_grouped_matmul import gated_ffn

        kernel = _gated_backend(backend)
        return lambda x, wg, wu, wd, gs: gated_ffn(
            x, wg, wu, wd, gs, activation=case.get("activation", "swiglu"), backend=kernel
        )
    if family in ("fp8_rowwise", "fp8_blockwise"):
        recipe = family.removeprefix("fp8_")
        return lambda x, w, gs: jaxmoe.fp8_grouped_matmul(x, w, gs, recipe=recipe, backend=backend)
    raise ValueError(f"unknown case family {family!r}")


def leaf_names(case: dict, operands: dict) -> list[str]:
    if case["pass"] == "fwd":
        return ["out"]
    return ["out", *(f"d{name}" for name in operands)]


def case_function(case: dict, operands: dict, dy):
    """The jitted forward (``out``) or forward+backward (``out`` and the operands' cotangents
    from ``jax.vjp`` with the fixed ``dy``)."""
    op = case_op(case)
    if case["pass"] == "fwd":
        return jax.jit(lambda *args: (op(*args),))
    if case["pass"] != "fwd+bwd":
        raise ValueError(f"unknown pass {case['pass']!r}")

    def fwd_bwd(*args):
        *arrays, gs = args
        out, vjp = jax.vjp(lambda *a: op(*a, gs), *arrays)
        return (out, *vjp(dy))

    return jax.jit(fwd_bwd)


def bits(array) -> np.ndarray:
    host = np.asarray(jax.device_get(array))
    return host.view(UNSIGNED[host.dtype.itemsize])


def digest(arrays) -> str:
    sha = hashlib.sha256()
    for array in arrays:
        sha.update(np.ascontiguousarray(bits(array)).tobytes())
    return sha.hexdigest()


def same_bits(first, second) -> bool:
    """Whether two runs' outputs agree bit for bit (compared on the device)."""

    def as_bits(array):
        return jax.lax.bitcast_convert_type(array, UNSIGNED[array.dtype.itemsize])

    return all(
        bool(jnp.array_equal(as_bits(a), as_bits(b))) for a, b in zip(first, second, strict=True)
    )


class Worker:
    """The case being measured (one at a time: a new build drops the last one)."""

    def __init__(self):
        self.timing = load_timing()
        self.call = None

    def build(self, case: dict, save_dir: str, repeat: bool = True) -> dict:
        self.call = None
        operands, dy = case_inputs(case)
        group_sizes = jnp.asarray(case["group_sizes"], jnp.int32)
        args = (*operands.values(), group_sizes)
        fn = case_function(case, operands, dy)
        start = time.perf_counter()
        first = jax.block_until_ready(fn(*args))
        first_s = time.perf_counter() - start
        second = jax.block_until_ready(fn(*args)) if repeat else None
        leaves = []
        Path(save_dir).mkdir(parents=True, exist_ok=True)
        for name, array in zip(leaf_names(case, operands), first, strict=True):
            path = Path(save_dir) / f"{name}.npy"
            np.save(path, bits(array))
            leaf = {"name": name, "dtype": str(array.dtype), "shape": list(array.shape)}
            leaves.append({**leaf, "file": str(path)})
        self.call = lambda: fn(*args)
        return {
            "leaves": leaves,
            "inputs_sha256": digest([*operands.values(), dy, group_sizes]),
            "repeatable": same_bits(first, second) if repeat else None,
            "first_call_s": first_s,
        }

    def warm(self, target_sample_ms: float) -> dict:
        inner = self.timing.warm_up(
            self.call,
            self.timing.jax_sync,
            warmup=2,
            target_sample_ms=target_sample_ms,
            max_inner=MAX_INNER,
        )
        return {"inner": inner}

    def sample(self, inner: int, settle_ms: float) -> dict:
        self.timing.settle(self.call, self.timing.jax_sync, inner, settle_ms)
        return {"ms": self.timing.take_sample(self.call, self.timing.jax_sync, inner)}

    def handle(self, command: dict) -> dict:
        op = command.get("op")
        if op == "hello":
            return hello()
        if op == "build":
            return self.build(command["case"], command["save_dir"], command.get("repeat", True))
        if self.call is None and op in ("warm", "sample"):
            raise RuntimeError(f"{op!r} before a case was built")
        if op == "warm":
            return self.warm(float(command["target_sample_ms"]))
        if op == "sample":
            return self.sample(int(command["inner"]), float(command["settle_ms"]))
        raise ValueError(f"unknown op {op!r}")


def _error_text(error: BaseException) -> str:
    last = traceback.extract_tb(error.__traceback__)[-1:] if error.__traceback__ else []
    where = f" (at {Path(last[0].filename).name}:{last[0].lineno})" if last else ""
    return f"{type(error).__name__}: {error}"[:1500] + where


def serve() -> None:
    # Replies go to the original stdout alone; whatever else writes to fd 1 (a library's print,
    # a C++ log) lands on stderr instead of breaking the protocol.
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    worker = Worker()
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            command = json.loads(line)
            if command.get("op") == "quit":
                replies.write(json.dumps({"ok": True}) + "\n")
                return
            reply = {"ok": True, **worker.handle(command)}
        except Exception as error:  # noqa: BLE001 - any failure of a case is the row's error
            traceback.print_exc()
            reply = {"ok": False, "error": _error_text(error)}
        replies.write(json.dumps(reply) + "\n")


if __name__ == "__main__":
    serve()
