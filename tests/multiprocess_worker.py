"""One process of the multi-process test: the sharded layer, forward and backward, over a mesh
whose devices belong to several processes (``jax.distributed`` + gloo CPU collectives).

Run by ``tests/test_multiprocess.py`` as::

  python -m tests.multiprocess_worker --process-id I --num-processes P --port N \
      --local-devices D --out result.npz --checkpoint-dir DIR

Every process builds the same global inputs from a fixed seed, places its own shards with
``jax.make_array_from_callback``, runs one jitted forward + backward per case and gathers the
results to every host; then it saves sharded parameters with ``jaxmoe.checkpoint`` and restores
them onto another mesh. Process 0 writes the results to ``--out``. :func:`run_case` is also
what the test runs in its own single process over 8 devices, so both sides run the same program.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

import jaxmoe
import jaxmoe.parallel
from jaxmoe import checkpoint

# (name, mesh shape, mesh axis names, data_axes, fsdp): "data2_ep4_fsdp" keeps each ep group
# inside one process and spans processes with the data axis (the layout docs/distributed.md
# recommends; FSDP all-gathers expert weights across processes); "ep8" makes the all-to-all
# itself cross processes.
CASES = (
    ("data2_ep4_fsdp", (2, 4), ("data", "ep"), ("data",), True),
    ("ep8", (8,), ("ep",), (), False),
)
BATCH, SEQ, HIDDEN = 16, 4, 16


def case_config(data_axes: tuple[str, ...], fsdp: bool) -> jaxmoe.MoEConfig:
    return jaxmoe.MoEConfig(
        num_experts=8,
        top_k=2,
        hidden_size=HIDDEN,
        ffn_size=32,
        num_shared_experts=1,
        aux_loss_coef=1e-2,
        ep_axis="ep",
        data_axes=data_axes,
        fsdp_expert_weights=fsdp,
    )


def host_inputs(cfg: jaxmoe.MoEConfig) -> tuple[dict, np.ndarray, np.ndarray]:
    """Parameters, ``x [B, S, H]`` and the output cotangent, as NumPy arrays (same everywhere)."""
    params = jax.tree.map(np.asarray, jaxmoe.init_params(jax.random.key(0), cfg))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, SEQ, HIDDEN)).astype(np.float32)
    cotangent = rng.standard_normal((BATCH, SEQ, HIDDEN)).astype(np.float32)
    return params, x, cotangent


def _global(value: np.ndarray, sharding: NamedSharding) -> jax.Array:
    # Each process fills only the shards of its own devices: the multi-process way to build a
    # global array (jax.device_put of a host value needs every shard addressable).
    return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])


def run_case(name: str, devices) -> dict[str, np.ndarray]:
    """Forward and backward of ``jaxmoe.moe`` on a mesh of ``devices``; host copies of results."""
    _, shape, axis_names, data_axes, fsdp = next(c for c in CASES if c[0] == name)
    cfg = case_config(data_axes, fsdp)
    mesh = jax.sharding.Mesh(np.array(devices).reshape(shape), axis_names)
    params, x, cotangent = host_inputs(cfg)
    specs = jaxmoe.parallel.param_partition_specs(cfg)
    params = jax.tree.map(lambda v, s: _global(v, NamedSharding(mesh, s)), params, specs)
    batch = NamedSharding(mesh, jaxmoe.parallel.batch_partition_spec(cfg, 3))
    x, cotangent = _global(x, batch), _global(cotangent, batch)

    def loss(params, x, cotangent):
        y, stats = jaxmoe.moe(params, x, cfg, mesh=mesh)
        return jnp.sum(y * cotangent) + stats.aux_loss, (y, stats.tokens_per_expert)

    step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))
    (value, (y, counts)), (grad_params, grad_x) = step(params, x, cotangent)
    tree = {"loss": value, "y": y, "tokens_per_expert": counts, "grad_x": grad_x}
    tree.update({f"grad{jax.tree_util.keystr(p)}": g for p, g in _flat(grad_params)})
    return _to_host(tree, mesh)


def checkpoint_round_trip(devices, directory: str) -> dict[str, np.ndarray]:
    """Saves the parameters sharded as the first case (data=2, ep=4, FSDP), restores them over
    ep=8 (``jaxmoe.checkpoint``, every process calling); host copies of the restored values."""
    _, shape, axis_names, data_axes, fsdp = CASES[0]
    cfg = case_config(data_axes, fsdp)
    mesh = jax.sharding.Mesh(np.array(devices).reshape(shape), axis_names)
    params = jax.tree.map(_global, host_inputs(cfg)[0], checkpoint.param_shardings(cfg, mesh))
    checkpoint.save(directory, 1, {"params": params})
    cfg8, mesh8 = case_config((), False), jax.sharding.Mesh(np.array(devices), ("ep",))
    target = {"params": checkpoint.abstract_params(cfg8, mesh8)}
    restored = checkpoint.restore(directory, target)["params"]
    assert restored["experts"]["w_up"].sharding == target["params"]["experts"]["w_up"].sharding
    return _to_host({jax.tree_util.keystr(p): v for p, v in _flat(restored)}, mesh8)


def _to_host(tree: dict, mesh) -> dict[str, np.ndarray]:
    # Replicate everything, then read this process's copy: every host gets the full result.
    replicated = NamedSharding(mesh, PartitionSpec())
    tree = jax.jit(lambda t: t, out_shardings=replicated)(tree)
    return {k: np.asarray(v.addressable_data(0)) for k, v in tree.items()}


def _flat(tree):
    return jax.tree_util.tree_flatten_with_path(tree)[0]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--process-id", type=int, required=True)
    parser.add_argument("--num-processes", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--local-devices", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--checkpoint-dir", required=True, help="the same path for every process")
    args = parser.parse_args(argv)

    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", args.local_devices)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.config.update("jax_default_matmul_precision", "highest")
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{args.port}",
        num_processes=args.num_processes,
        process_id=args.process_id,
        initialization_timeout=60,
    )
    assert jax.process_count() == args.num_processes, jax.process_count()
    assert jax.local_device_count() == args.local_devices, jax.local_devices()
    # jax.devices() lists every process's devices, process 0's first: a (data, ep) reshape puts
    # each data row on one process.
    devices = jax.devices()
    assert [d.process_index for d in devices] == sorted(d.process_index for d in devices)
    results = {}
    for name, *_ in CASES:
        for key, value in run_case(name, devices).items():
            results[f"{name}/{key}"] = value
    for key, value in checkpoint_round_trip(devices, args.checkpoint_dir).items():
        results[f"checkpoint/{key}"] = value
    if args.process_id == 0:
        np.savez(args.out, **results)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
