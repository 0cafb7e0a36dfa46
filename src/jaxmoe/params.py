"""Parameters of an MoE layer: creation, shape checks and logical sharding axes."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxmoe.argument_checks import describe
from jaxmoe.config import MoEConfig

# Logical axis names (Flax style). ``parallel.sharding`` maps them to mesh axes.
EMBED, MLP, EXPERT, ROUTER = "embed", "mlp", "expert", "router"
BATCH, SEQUENCE = "batch", "sequence"


def param_shapes(cfg: MoEConfig) -> dict:
    """The parameter tree as shapes: the layout ``init_params`` makes and ``moe`` expects."""
    num_experts, hidden, ffn = cfg.num_experts, cfg.hidden_size, cfg.ffn_size
    experts = {"w_up": (num_experts, hidden, ffn), "w_down": (num_experts, ffn, hidden)}
    if cfg.gated:
        experts = {"w_gate": (num_experts, hidden, ffn), **experts}
    if cfg.expert_ffn_bias:
        experts.update(b_up=(num_experts, ffn), b_down=(num_experts, hidden))
        if cfg.gated:
            experts["b_gate"] = (num_experts, ffn)
    router = {"kernel": (hidden, num_experts)}
    if cfg.router_bias:
        router["bias"] = (num_experts,)
    shapes = {"router": router, "experts": experts}
    if cfg.use_expert_bias:
        shapes["expert_bias"] = (num_experts,)
    if cfg.num_shared_experts:
        shared_ffn = cfg.effective_shared_ffn_size
        shared = {"w_up": (hidden, shared_ffn), "w_down": (shared_ffn, hidden)}
        if cfg.gated:
            shared = {"w_gate": (hidden, shared_ffn), **shared}
        if cfg.shared_expert_gate:
            shared["output_gate"] = (hidden, 1)
        shapes["shared"] = shared
    return shapes


def param_logical_axes(cfg: MoEConfig) -> dict:
    """Logical axis names of every parameter, in the same tree as :func:`param_shapes`."""
    experts = {"w_up": (EXPERT, EMBED, MLP), "w_down": (EXPERT, MLP, EMBED)}
    if cfg.gated:
        experts["w_gate"] = (EXPERT, EMBED, MLP)
    if cfg.expert_ffn_bias:  # with their experts: E over the expert axis
        experts.update(b_up=(EXPERT, MLP), b_down=(EXPERT, EMBED))
        if cfg.gated:
            experts["b_gate"] = (EXPERT, MLP)
    router = {"kernel": (EMBED, ROUTER)}
    if cfg.router_bias:
        router["bias"] = (ROUTER,)
    axes = {"router": router, "experts": experts}
    if cfg.use_expert_bias:
        axes["expert_bias"] = (ROUTER,)
    if cfg.num_shared_experts:
        shared = {"w_up": (EMBED, MLP), "w_down": (MLP, EMBED)}
        if cfg.gated:
            shared["w_gate"] = (EMBED, MLP)
        if cfg.shared_expert_gate:
            shared["output_gate"] = (EMBED, None)
        axes["shared"] = shared
    return jax.tree.map(lambda s, a: a, param_shapes(cfg), axes, is_leaf=_is_shape)


def _is_shape(node) -> bool:
    return isinstance(node, tuple) and all(isinstance(d, int) for d in node)


# The leaves init_params starts at zero: the biases (by their key, the last of a leaf's path).
_ZERO_INIT = ("['expert_bias']", "['bias']", "['b_gate']", "['b_up']", "['b_down']")

# The config field that sets each logical axis's size (the shared experts' ``mlp`` differs).
_AXIS_FIELDS = {EXPERT: "num_experts", ROUTER: "num_experts", EMBED: "hidden_size", MLP: "ffn_size"}
_SHARED_MLP_FIELD = "shared_ffn_size, or ffn_size * num_shared_experts when None"


def param_axis_fields(cfg: MoEConfig) -> dict:
    """The ``MoEConfig`` field that sets each axis of each parameter, in the tree of
    :func:`param_shapes` (e.g. ``experts/w_up``: ``("num_experts", "hidden_size", "ffn_size")``),
    so a shape error can say which field the parameters disagree on."""

    def fields(path, names):
        shared = jax.tree_util.keystr(path[:1]) == "['shared']"
        return tuple(
            _SHARED_MLP_FIELD if shared and n == MLP else _AXIS_FIELDS.get(n) for n in names
        )

    return jax.tree_util.tree_map_with_path(
        fields, param_logical_axes(cfg), is_leaf=_is_shape_names
    )


def _is_shape_names(node) -> bool:
    return isinstance(node, tuple) and all(n is None or isinstance(n, str) for n in node)


def check_config(cfg, where: str) -> MoEConfig:
    """``cfg`` if it is a :class:`jaxmoe.MoEConfig`; else a TypeError naming ``cfg``."""
    if isinstance(cfg, MoEConfig):
        return cfg
    fix = (
        "Build it with jaxmoe.MoEConfig(**that_mapping)."
        if hasattr(cfg, "keys")
        else "Build one with jaxmoe.MoEConfig(num_experts=..., top_k=..., hidden_size=..., "
        "ffn_size=...)."
    )
    raise TypeError(f"{where}: `cfg` must be a jaxmoe.MoEConfig; got {describe(cfg)}. {fix}")


def check_key(key, where: str) -> None:
    """Raises unless ``key`` is one PRNG key, naming ``key``: a typed key of shape ``()``
    (``jax.random.key(0)``) or a legacy raw key (``jax.random.PRNGKey(0)``: ``uint32`` of the
    default implementation's key shape, ``(2,)`` for threefry). Tracers are checked by their
    shape and dtype, so this holds under ``jit`` and ``vmap`` too.

    Raises:
      TypeError: ``key`` is not a key (an int seed, a float array, ``None``, a list).
      ValueError: a key array of another shape (several keys, or raw data of another length).
    """
    fix = "Pass one key, e.g. jax.random.key(0) (an int is a seed, not a key)."
    dtype = getattr(key, "dtype", None)
    shape = tuple(np.shape(key)) if dtype is not None else None
    if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        if shape == ():
            return
        raise ValueError(
            f"{where}: `key` must be a single PRNG key (shape ()); got a key array of shape "
            f"{shape}. Pass one of them, e.g. keys[0]; for one set of parameters per key, "
            f"jax.vmap(lambda k: ...(k, cfg))(keys)."
        )
    if dtype is not None and dtype == np.uint32:
        raw_shape = jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0))).shape
        if shape == tuple(raw_shape):
            return
        raise ValueError(
            f"{where}: `key` as raw uint32 key data must have shape {tuple(raw_shape)} (as "
            f"jax.random.PRNGKey(0)); got shape {shape}. {fix}"
        )
    got = describe(key) if dtype is None else f"{describe(key)}, dtype {dtype}"
    raise TypeError(f"{where}: `key` must be a jax PRNG key; got {got}. {fix}")


def init_params(key: jax.Array, cfg: MoEConfig) -> dict:
    """Creates the parameters of an MoE layer.

    Weights are drawn from a truncated normal with standard deviation ``1/sqrt(fan_in)`` (LeCun);
    every bias (``expert_bias``, the router's ``bias``, the experts' ``b_*``) starts at zero.

    Returns:
      ``{"router": {"kernel": [H, E], "bias": [E] (router_bias only)}, "experts": {"w_gate":
      [E, H, F] (gated only), "w_up": [E, H, F], "w_down": [E, F, H], and with expert_ffn_bias
      "b_gate": [E, F] (gated only), "b_up": [E, F], "b_down": [E, H]}, "expert_bias": [E]
      (use_expert_bias only), "shared": {"w_gate": [H, Fs] (gated only), "w_up": [H, Fs],
      "w_down": [Fs, H], "output_gate": [H, 1] (shared_expert_gate only)} (shared experts
      only)}`` in ``cfg.param_dtype``.

    Raises:
      TypeError: ``key`` is not a PRNG key (e.g. the int ``0``: pass ``jax.random.key(0)``) or
        ``cfg`` not a ``MoEConfig``; ValueError: ``key`` holds several keys. Legacy
        ``jax.random.PRNGKey`` keys are accepted.
    """
    check_key(key, "init_params")
    check_config(cfg, "init_params")
    shapes = param_shapes(cfg)
    leaves, treedef = jax.tree.flatten(shapes, is_leaf=_is_shape)
    keys = jax.random.split(key, len(leaves))
    paths = [
        jax.tree_util.keystr(p)
        for p, _ in jax.tree_util.tree_flatten_with_path(shapes, is_leaf=_is_shape)[0]
    ]
    values = []
    for leaf_key, shape, path in zip(keys, leaves, paths, strict=True):
        if path.endswith(_ZERO_INIT):
            values.append(jnp.zeros(shape, cfg.param_dtype))
            continue
        fan_in = shape[-2]
        std = 1.0 / math.sqrt(fan_in)
        values.append(
            (std * jax.random.truncated_normal(leaf_key, -2.0, 2.0, shape, jnp.float32)).astype(
                cfg.param_dtype
            )
        )
    return jax.tree.unflatten(treedef, values)


def check_params(params, cfg: MoEConfig, *, where: str = "moe") -> None:
    """Raises ValueError naming the first leaf whose presence, shape or dtype is wrong; a shape
    error also names the ``MoEConfig`` field that sets each disagreeing axis (params made for
    another config). ``where`` starts the message (the caller's name)."""
    expected = param_shapes(cfg)
    expected_flat = dict(
        (jax.tree_util.keystr(path), shape)
        for path, shape in jax.tree_util.tree_flatten_with_path(expected, is_leaf=_is_shape)[0]
    )
    fields_flat = dict(
        (jax.tree_util.keystr(path), names)
        for path, names in jax.tree_util.tree_flatten_with_path(
            param_axis_fields(cfg), is_leaf=_is_shape_names
        )[0]
    )
    try:
        given_flat = dict(
            (jax.tree_util.keystr(path), leaf)
            for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]
        )
    except Exception as error:  # pragma: no cover - exotic containers
        raise ValueError(f"{where}: `params` is not a pytree of arrays ({error}).") from error
    for path, shape in expected_flat.items():
        if path not in given_flat:
            raise ValueError(
                f"{where}: params{path} is missing; a layer with this config needs "
                f"{sorted(expected_flat)}. Make params with jaxmoe.init_params(key, cfg)."
            )
        leaf = given_flat[path]
        got = tuple(np.shape(leaf))
        if got != shape:
            raise ValueError(
                f"{where}: params{path} has shape {got}, expected {shape} for "
                f"E={cfg.num_experts}, H={cfg.hidden_size}, F={cfg.ffn_size}; "
                f"{_disagreeing_fields(got, shape, fields_flat[path])}. These params were "
                "made for another config: use that config, or make them with "
                "jaxmoe.init_params(key, cfg)."
            )
        if not jnp.issubdtype(jnp.result_type(leaf), jnp.floating):
            raise ValueError(
                f"{where}: params{path} must be floating point; got dtype {jnp.result_type(leaf)}."
            )
    bias = given_flat.get("['expert_bias']")
    if bias is not None:  # shape and dtype checked above; now its values
        check_vector(f"{where}: params['expert_bias']", bias, cfg.num_experts)
    extra = sorted(set(given_flat) - set(expected_flat))
    if extra:
        raise ValueError(
            f"{where}: params{extra[0]} is not used by this config (unexpected leaves {extra}); "
            "check use_expert_bias / num_shared_experts / activation / router_bias / "
            "expert_ffn_bias / shared_expert_gate."
        )


def _disagreeing_fields(got: tuple, shape: tuple, fields: tuple[str, ...]) -> str:
    if len(got) != len(shape):
        named = ", ".join(field for field in fields if field)
        return f"its axes are set by MoEConfig.{named}"
    return "; ".join(
        f"axis {axis} is {want} ({f'MoEConfig.{field}' if field else 'always'}), these params "
        f"have {have}"
        for axis, (have, want, field) in enumerate(zip(got, shape, fields, strict=True))
        if have != want
    )


def _describe(value) -> str:
    """A short description of an argument (never its contents: a long list is unreadable)."""
    try:
        array = value if hasattr(value, "dtype") else np.asarray(value)
        return f"{type(value).__name__} of shape {tuple(np.shape(array))}, dtype {array.dtype}"
    except (TypeError, ValueError):
        return f"{type(value).__name__} that is not a rectangular array of numbers"


def check_vector(
    where: str, value, length: int | None, *, integer_ok: bool = False, nonnegative: bool = False
) -> jax.Array:
    """``value`` (an array, or a list or tuple of numbers) as a ``[length]`` jax array, checked.

    ``length=None`` takes any non-empty 1-D value.

    Checked before tracing: the shape, and the dtype (floating; also integer with
    ``integer_ok``; never bool). A concrete value (eager, or a constant under ``jit``) must also
    be finite (and ``>= 0`` with ``nonnegative``); a traced one cannot be read until it runs, so
    its callers document what they do with non-finite entries.

    Raises:
      ValueError: naming ``where``, the rule, what was received (described, not dumped) and
        the fix.
    """
    kinds = "an integer or floating" if integer_ok else "a floating"
    rule = f"must be a {'1-D' if length is None else [length]} array of {kinds} dtype"
    fix = f"Pass {length} numbers: a jax or numpy array, or a list."
    if not isinstance(value, jax.core.Tracer) and not hasattr(value, "dtype"):
        try:
            value = np.asarray(value)
        except (TypeError, ValueError):
            raise ValueError(f"{where}: {rule}; got {_describe(value)}. {fix}") from None
    dtype = getattr(value, "dtype", None)
    numeric = dtype is not None and (
        jnp.issubdtype(dtype, jnp.floating) or (integer_ok and jnp.issubdtype(dtype, jnp.integer))
    )
    shape = tuple(np.shape(value))
    if not numeric or len(shape) != 1 or shape[0] != (length or shape[0] or 1):
        raise ValueError(f"{where}: {rule}; got {_describe(value)}. {fix}")
    if not isinstance(value, jax.core.Tracer):
        host = np.asarray(value, np.float64)
        bad = ~np.isfinite(host) | ((host < 0) if nonnegative else False)
        if bad.any():
            need = "finite and >= 0" if nonnegative else "finite"
            raise ValueError(
                f"{where}: every entry must be {need}; got {host[bad][:8].tolist()} at indices "
                f"{np.flatnonzero(bad)[:8].tolist()}. Check what produced them; to drop NaN and "
                "inf entries: jnp.where(jnp.isfinite(v), v, 0)."
            )
    return jnp.asarray(value)
