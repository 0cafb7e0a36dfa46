"""``jaxmoe demo``: train a small MoE character-level language model on Shakespeare, on a CPU.

The loop: sample random windows of the bundled corpus, one jitted step (cross-entropy plus every
layer's router ``aux_loss``, AdamW), optionally the aux-loss-free bias update, and a record of each
layer's expert load. At the end: a summary, a few sampled lines, ``metrics.json`` and ``demo.png``.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import json
import math
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen, nnx
from jax.sharding import NamedSharding, PartitionSpec

import jaxmoe
from jaxmoe.cli import flags
from jaxmoe.cli.model import CharTransformer, ModelConfig
from jaxmoe.cli.plot import expert_balance, plot_demo
from jaxmoe.cli.resume import DemoCheckpoints, check_resume


@dataclasses.dataclass(frozen=True)
class DemoConfig:
    """Everything ``jaxmoe demo`` can be told (the CLI flags) and the sizes it picks."""

    steps: int = 300
    num_experts: int = 8
    top_k: int = 2
    score: str = "softmax"
    aux_loss: float = 1e-2
    expert_bias_rate: float = 0.0
    devices: int = 1
    seed: int = 0
    out: str = "jaxmoe-demo"
    fp8: str | None = None  # MoEConfig.fp8_recipe of every layer
    fp8_wgrad: str = "auto"  # Fp8Recipe.wgrad: "fp8" runs the weight gradients in FP8 too
    width: int = 128
    ffn_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    seq_len: int = 64
    batch_size: int = 16
    learning_rate: float = 3e-3
    warmup_steps: int = 20
    sample_chars: int = 240
    checkpoint_dir: str | None = None
    save_every: int = 50


# The demo flag that sets each MoEConfig field of the layers (moe_config).
MOE_FLAGS = {
    "num_experts": "--experts",
    "top_k": "--top-k",
    "score": "--score",
    "aux_loss_coef": "--aux-loss",
    "use_expert_bias": "--expert-bias-rate",
    "ep_axis": "--devices",
    "fp8_recipe": "--fp8",
}


def check_demo_config(cfg: DemoConfig) -> None:
    """Raises ValueError with the flag's name, the rule, the value and the fix: the demo's own
    rules, then every rule of the layers' ``MoEConfig`` (built here, before any work)."""
    if cfg.steps < 1:
        raise ValueError(f"--steps must be >= 1; got {cfg.steps}.")
    if not 1 <= cfg.top_k <= cfg.num_experts:
        raise ValueError(
            f"--top-k must be between 1 and --experts ({cfg.num_experts}); got {cfg.top_k}."
        )
    if cfg.expert_bias_rate < 0:
        raise ValueError(f"--expert-bias-rate must be >= 0; got {cfg.expert_bias_rate}.")
    if cfg.expert_bias_rate > 0 and cfg.score == "softmax":
        raise ValueError(
            f"--expert-bias-rate {cfg.expert_bias_rate} needs --score sigmoid or sqrtsoftplus: "
            "the aux-loss-free expert bias shifts selection scores that are not normalised over "
            "experts (DeepSeek-V3), which softmax scores are. Add `--score sigmoid`, or drop "
            "--expert-bias-rate."
        )
    if cfg.aux_loss < 0:
        raise ValueError(f"--aux-loss must be >= 0; got {cfg.aux_loss}.")
    if cfg.fp8_wgrad == "fp8" and cfg.fp8 != "rowwise":
        raise ValueError(
            f"--fp8-wgrad fp8 needs --fp8 rowwise; got --fp8 {cfg.fp8}. Add `--fp8 rowwise`, "
            "or drop --fp8-wgrad (blockwise has no FP8 wgrad)."
        )
    if cfg.devices > 1 and cfg.num_experts % cfg.devices:
        raise ValueError(
            f"--experts ({cfg.num_experts}) must be a multiple of --devices ({cfg.devices}): "
            "each device holds an equal share of the experts."
        )
    if cfg.devices > 1 and cfg.batch_size % cfg.devices:
        raise ValueError(
            f"the batch ({cfg.batch_size} sequences) must be a multiple of --devices "
            f"({cfg.devices})."
        )
    try:
        moe_config(cfg)
    except ValueError as error:
        raise ValueError(flags.config_error(error, MOE_FLAGS)) from None


def check_demo_run(cfg: DemoConfig) -> int:
    """:func:`check_demo_config` and :func:`check_resume`: the step to resume from (0: none)."""
    check_demo_config(cfg)
    return check_resume(cfg)


def load_corpus() -> str:
    """The bundled tiny-Shakespeare text (read from the installed package, not the repo)."""
    return (
        importlib.resources.files("jaxmoe.cli")
        .joinpath("data/tinyshakespeare.txt")
        .read_text(encoding="utf-8")
    )


class CharCodec:
    """Characters <-> integer ids, over the characters of the corpus."""

    def __init__(self, text: str):
        self.chars = sorted(set(text))
        self.index = {c: i for i, c in enumerate(self.chars)}

    def encode(self, text: str) -> np.ndarray:
        return np.array([self.index[c] for c in text], dtype=np.int32)

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)


def make_mesh(devices: int):
    """A 1-D mesh named ``ep`` over the first ``devices`` devices, or None for one device."""
    if devices <= 1:
        return None
    available = jax.devices()
    if len(available) < devices:
        raise RuntimeError(
            f"--devices {devices} asked for {devices} devices but JAX sees {len(available)}; "
            "run through the `jaxmoe` command, which simulates CPU devices with XLA_FLAGS."
        )
    return jax.sharding.Mesh(np.array(available[:devices]), ("ep",))


def _fp8_recipe(cfg: DemoConfig):
    """The demo's ``MoEConfig.fp8_recipe``: the recipe name (its ``wgrad="auto"``), or an
    ``Fp8Recipe`` with the weight gradients' precision asked for."""
    if cfg.fp8 is None or cfg.fp8_wgrad == "auto":
        return cfg.fp8
    return jaxmoe.ops.fp8.Fp8Recipe(cfg.fp8, wgrad=cfg.fp8_wgrad)


def moe_config(cfg: DemoConfig) -> jaxmoe.MoEConfig:
    """The ``MoEConfig`` of every layer (``ValueError`` from its rules)."""
    return jaxmoe.MoEConfig(
        num_experts=cfg.num_experts,
        top_k=cfg.top_k,
        hidden_size=cfg.width,
        ffn_size=cfg.ffn_size,
        score=cfg.score,
        aux_loss_coef=cfg.aux_loss,
        z_loss_coef=1e-3,
        use_expert_bias=cfg.expert_bias_rate > 0,
        ep_axis="ep" if cfg.devices > 1 else None,
        fp8_recipe=_fp8_recipe(cfg),
    )


def build(cfg: DemoConfig, vocab_size: int):
    """The model and its optimizer (AdamW on ``nnx.Param`` only: the expert bias is state)."""
    model_cfg = ModelConfig(
        vocab_size=vocab_size,
        seq_len=cfg.seq_len,
        num_layers=cfg.num_layers,
        num_heads=cfg.num_heads,
        moe=moe_config(cfg),
    )
    model = CharTransformer(model_cfg, rngs=nnx.Rngs(cfg.seed), mesh=make_mesh(cfg.devices))
    schedule = optax.warmup_cosine_decay_schedule(
        0.0,
        cfg.learning_rate,
        cfg.warmup_steps,
        max(cfg.steps, cfg.warmup_steps + 1),
        end_value=0.1 * cfg.learning_rate,
    )
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=0.01))
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
    return model, optimizer


def state_shardings(state, mesh, moe_cfg: jaxmoe.MoEConfig):
    """Where the model and optimizer ``state`` live on an expert-parallel ``mesh``: the experts'
    weights and their optimizer moments split over ``ep`` by their logical ``expert`` axis
    (:func:`jaxmoe.parallel.logical_axis_rules`), everything else replicated."""
    logical = nnx.get_partition_spec(state)
    rules = jaxmoe.parallel.logical_axis_rules(moe_cfg)

    def without_trailing_nones(sharding):
        # As jit's results carry it: P('ep', None, None) and P('ep') are one layout but two
        # keys of jit's dispatch cache.
        axes = list(sharding.spec)
        while axes and axes[-1] is None:
            axes.pop()
        return NamedSharding(mesh, PartitionSpec(*axes))

    return jax.tree.map(
        without_trailing_nones, linen.logical_to_mesh_sharding(logical, mesh, rules)
    )


def make_train_step(graphdef, expert_bias_rate: float, shardings=None):
    """A jitted ``(state, tokens) -> (state, loss, aux_loss, tokens_per_expert, dropped)``.

    The model and optimizer travel as one ``nnx.State`` (split once), which keeps the per-step
    Python overhead to a plain ``jax.jit`` call. ``shardings`` (:func:`state_shardings`): the
    state comes back as it went in, so the step compiles once (left to XLA, the state returned
    by the first step is laid out on the mesh where the initial one was not, and the second
    step compiled again).
    """

    def loss_fn(model, tokens):
        logits, stats = model(tokens[:, :-1])
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()
        aux = jnp.sum(stats.aux_loss)
        return ce + aux, (ce, aux, stats)

    @jax.jit
    def train_step(state, tokens):
        model, optimizer = nnx.merge(graphdef, state)
        grads, (ce, aux, stats) = nnx.grad(loss_fn, has_aux=True)(model, tokens)
        optimizer.update(model, grads)
        if expert_bias_rate > 0:
            model.update_expert_bias(stats.tokens_per_expert, expert_bias_rate)
        new_state = nnx.state((model, optimizer))
        if shardings is not None:
            new_state = jax.lax.with_sharding_constraint(new_state, shardings)
        return (
            new_state,
            ce,
            aux,
            stats.tokens_per_expert,
            jnp.sum(stats.dropped_tokens),
        )

    return train_step


def make_eval_loss(graphdef):
    @jax.jit
    def eval_loss(state, tokens):
        model, _ = nnx.merge(graphdef, state)
        logits, _ = model(tokens[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    return eval_loss


def sample_text(
    model, codec: CharCodec, seq_len: int, num_chars: int, seed: int, rows: int = 1
) -> str:
    """Samples ``num_chars`` characters (temperature 0.8) from a newline, one jitted call each.

    ``rows`` copies of the window form the batch (an expert-parallel mesh needs one per device).
    """
    graphdef, state = nnx.split(model)

    @jax.jit
    def next_token(state, window, length, key):
        batch = jnp.broadcast_to(window[None], (rows, window.shape[0]))
        logits, _ = nnx.merge(graphdef, state)(batch)
        return jax.random.categorical(key, logits[0, length - 1] / 0.8)

    window = np.zeros(seq_len, np.int32)
    window[0] = codec.index["\n"]
    length, out = 1, []
    key = jax.random.key(seed)
    for _ in range(num_chars):
        key, sub = jax.random.split(key)
        token = int(next_token(state, jnp.asarray(window), length, sub))
        out.append(token)
        if length < seq_len:
            window[length] = token
            length += 1
        else:  # slide the window: keep the last seq_len characters
            window = np.roll(window, -1)
            window[-1] = token
    return codec.decode(out)


def tokens_per_second(tokens_per_step: int, timed_steps: int, seconds: float) -> float | None:
    """Training throughput over ``timed_steps`` steps (None when none was timed)."""
    return tokens_per_step * timed_steps / max(seconds, 1e-9) if timed_steps > 0 else None


def run_demo(cfg: DemoConfig) -> dict | None:
    """Trains, prints a summary and samples, writes ``metrics.json`` and ``demo.png``.

    Returns the metrics dictionary written to ``metrics.json``; None, having written nothing,
    when the checkpoint to resume from is already at or past ``cfg.steps`` (nothing to do).
    """
    from tqdm.auto import tqdm

    saved_step = check_demo_run(cfg)
    if saved_step >= cfg.steps:
        print(
            f"jaxmoe demo: nothing to do: {cfg.checkpoint_dir} is at step {saved_step}, at or "
            f"past --steps {cfg.steps} (raise --steps to train on)"
        )
        return None
    out_dir = Path(cfg.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    text = load_corpus()
    codec = CharCodec(text)
    data = codec.encode(text)
    split = int(0.9 * len(data))
    train_data, val_data = data[:split], data[split:]
    rng = np.random.default_rng(cfg.seed)
    window = cfg.seq_len + 1  # inputs and their next-character targets

    def batch(source: np.ndarray) -> jax.Array:
        starts = rng.integers(0, len(source) - window, cfg.batch_size)
        return jnp.asarray(np.stack([source[s : s + window] for s in starts]))

    model, optimizer = build(cfg, len(codec.chars))
    graphdef, state = nnx.split((model, optimizer))
    mesh = make_mesh(cfg.devices)  # the model's (build's) mesh
    shardings = None if mesh is None else state_shardings(state, mesh, model.cfg.moe)
    train_step = make_train_step(graphdef, cfg.expert_bias_rate, shardings)
    eval_loss = make_eval_loss(graphdef)
    val_batches = [batch(val_data) for _ in range(4)]
    val_every = max(1, cfg.steps // 6)

    moe_cfg = model.cfg.moe
    print(
        f"jaxmoe demo: {cfg.num_layers}-layer char transformer, width {cfg.width}, "
        f"{moe_cfg.num_experts} experts top-{moe_cfg.top_k} ({moe_cfg.score}), "
        f"{len(codec.chars)} symbols, batch {cfg.batch_size}x{cfg.seq_len}, {cfg.steps} steps "
        f"on {cfg.devices} {jax.default_backend()} device(s)"
    )
    tokens_per_step = cfg.batch_size * cfg.seq_len
    record = {"loss": [], "aux_loss": [], "tokens_per_expert": [], "dropped": []}
    metrics = {"step": [], "val_step": [], "val_loss": []}
    first_step, checkpoints = 1, None
    if cfg.checkpoint_dir:
        checkpoints = DemoCheckpoints(
            cfg.checkpoint_dir, cfg.save_every, config=dataclasses.asdict(cfg)
        )
        state, first_step = checkpoints.resume(state, rng, record, metrics)
    if shardings is not None:
        state = jax.device_put(state, shardings)
    start = time.perf_counter()
    compile_s = 0.0
    bar = tqdm(range(first_step, cfg.steps + 1), desc="training", unit="step", dynamic_ncols=True)
    for step in bar:
        t0 = time.perf_counter()
        state, loss, aux, counts, dropped = train_step(state, batch(train_data))
        if step == first_step:
            jax.block_until_ready(state)
            compile_s = time.perf_counter() - t0
            start = time.perf_counter()  # throughput excludes the first (compiling) step
        metrics["step"].append(step)
        for key, value in zip(record, (loss, aux, counts, dropped), strict=True):
            record[key].append(value)
        if step % val_every == 0 or step == cfg.steps:
            metrics["val_step"].append(step)
            metrics["val_loss"].append(float(np.mean([eval_loss(state, b) for b in val_batches])))
        if step % 10 == 0 or step == cfg.steps:
            # Dispatched steps run ahead of Python: the rate counts the ones that finished.
            jax.block_until_ready(state)
            rate = tokens_per_second(
                tokens_per_step, step - first_step, time.perf_counter() - start
            )
            postfix = {"loss": f"{float(loss):.3f}"}
            if rate is not None:
                postfix["tok_s"] = f"{rate:,.0f}"
            bar.set_postfix(postfix)
        if checkpoints:
            checkpoints.maybe_save(step, cfg.steps, state, rng, record, metrics)
    bar.close()
    jax.block_until_ready(state)
    train_s = time.perf_counter() - start
    nnx.update((model, optimizer), state)

    host = jax.device_get(record)
    loss = np.array(host["loss"], dtype=np.float64)
    load = np.array(host["tokens_per_expert"], dtype=np.int64)  # [steps, L, E]
    last = load[-max(1, cfg.steps // 10) :].sum(0)  # the last tenth of training, [L, E]
    final_loss = float(loss[-max(1, min(10, cfg.steps)) :].mean())
    metrics.update(
        title=(
            f"jaxmoe demo: {cfg.num_layers} layers, {cfg.num_experts} experts top-{cfg.top_k}, "
            f"score={cfg.score}, aux_loss={cfg.aux_loss:g}, "
            f"expert_bias_rate={cfg.expert_bias_rate:g}"
            + (f", fp8={cfg.fp8}" if cfg.fp8 else "")
            + (f", fp8_wgrad={cfg.fp8_wgrad}" if cfg.fp8 and cfg.fp8_wgrad != "auto" else "")
        ),
        loss=loss.tolist(),
        aux_loss=np.array(host["aux_loss"], dtype=np.float64).tolist(),
        tokens_per_expert=load.tolist(),
        dropped_tokens=np.array(host["dropped"], dtype=np.int64).tolist(),
        final_loss=final_loss,
        max_over_mean_load=expert_balance(last).tolist(),
        compile_seconds=compile_s,
        train_seconds=train_s,
        # Over the steps after this run's first (None: it ran only that compiling step).
        tokens_per_second=tokens_per_second(tokens_per_step, cfg.steps - first_step, train_s),
        config=dataclasses.asdict(cfg),
        vocab="".join(codec.chars),
    )
    if not all(math.isfinite(v) for v in metrics["loss"]):
        print("warning: the loss became non-finite during training")

    print(f"\nsummary after {cfg.steps} steps ({train_s:.1f} s + {compile_s:.1f} s compile):")
    rate = metrics["tokens_per_second"]
    print(
        f"  loss {loss[0]:.3f} -> {final_loss:.3f} (mean of the last steps); "
        f"validation {metrics['val_loss'][-1]:.3f}; "
        + (
            f"{rate:,.0f} tokens/s"
            if rate is not None
            else "tokens/s not measured (this run made only its first, compiling step)"
        )
    )
    for layer, (balance, counts) in enumerate(
        zip(metrics["max_over_mean_load"], last, strict=True)
    ):
        share = " ".join(f"{c / max(counts.sum(), 1):.2f}" for c in counts)
        print(f"  layer {layer}: max/mean expert load {balance:.2f}  (shares: {share})")
    print(f"  dropped tokens: {int(sum(metrics['dropped_tokens']))} (the layer is dropless)")

    if cfg.sample_chars:
        sample = sample_text(
            model, codec, cfg.seq_len, cfg.sample_chars, cfg.seed, rows=max(1, cfg.devices)
        )
        print("\nsample:\n" + "\n".join("  | " + line for line in sample.splitlines()[:8]))
        metrics["sample"] = sample

    (out_dir / "metrics.json").write_text(json.dumps(metrics))
    plot_demo(metrics, out_dir / "demo.png")
    print(f"\nwrote {out_dir / 'metrics.json'} and {out_dir / 'demo.png'}")
    return metrics
