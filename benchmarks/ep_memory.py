"""Temporaries of the dropless expert-parallel layer at EP=8 on 8 CPU devices (XLA's
``memory_analysis``, forward and training), against the fast slots alone and worst-case slots:
the case ``tests/test_memory.py::test_dropless_ep_memory_is_close_to_fast_slots_alone`` bounds.

    python benchmarks/ep_memory.py --out /tmp/ep-memory.json
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ["JAX_PLATFORMS"] = "cpu"

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jaxmoe  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=None, help="JSON file (default: print only)")
    args = parser.parse_args()
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("ep",))
    tokens_per_rank, hidden, ffn, num_experts, top_k = 64, 64, 64, 32, 8
    cfg = jaxmoe.MoEConfig(num_experts, top_k, hidden, ffn, ep_axis="ep", alignment=1)
    params = jaxmoe.init_params(jax.random.key(0), cfg)
    x = jnp.ones((mesh.size * tokens_per_rank, hidden), jnp.float32)
    variants = {
        "dropless (default)": cfg,
        "fast slots alone (ep_receive_factor=1.125)": dataclasses.replace(
            cfg, ep_receive_factor=1.125
        ),
        "worst-case slots (ep_fast_slot_factor=None)": dataclasses.replace(
            cfg, ep_fast_slot_factor=None
        ),
    }
    rows = []
    for name, variant in variants.items():
        for training in (False, True):
            f = lambda p, x, c=variant: jnp.sum(jaxmoe.moe(p, x, c, mesh=mesh)[0])  # noqa: E731
            f = jax.grad(f, argnums=(0, 1)) if training else f
            memory = jax.jit(f).lower(params, x).compile().memory_analysis()
            rows.append(
                {
                    "variant": name,
                    "pass": "fwd+bwd" if training else "fwd",
                    "temp_mb": memory.temp_size_in_bytes / 1e6,
                }
            )
            print(f"{name:45s} {rows[-1]['pass']:8s} {rows[-1]['temp_mb']:7.2f} MB", flush=True)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    header = {
        "device": "8 simulated CPU devices (XLA memory_analysis, nothing executed)",
        "jax": jax.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "command": " ".join(["python", *sys.argv]),
        "commit": commit,
        "shape": {
            "tokens_per_rank": tokens_per_rank,
            "H": hidden,
            "F": ffn,
            "E": num_experts,
            "K": top_k,
            "ep": mesh.size,
        },
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"header": header, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
