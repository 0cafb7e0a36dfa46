"""gpt-oss experts stored in MXFP4 (its Hub checkpoints' format): the dequantization against
values built from the format's definition (and against transformers' own dequantizer where it
is importable), and a tiny gpt-oss checkpoint with MXFP4 expert tensors, made by this file's own
packer, loading to exactly the dequantized values, with and without a mesh."""

import json
import os

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file
from test_hf import record_reads

import jaxmoe.hf
from jaxmoe.hf import checkpoint as hf_checkpoint
from jaxmoe.hf.mxfp4 import dequantize_mxfp4

GOLDEN = os.path.join(os.path.dirname(__file__), "hf_golden")
PREFIX = "model.layers.0.mlp"
E, H, F = 8, 32, 32  # MXFP4 blocks are 32 input values: both widths a multiple of 32


def e2m1_table() -> np.ndarray:
    """FP4 E2M1 code -> value, from the format: bit 3 sign, bits 2-1 exponent (bias 1), bit 0
    mantissa; exponent 0 is subnormal (``m / 2``)."""
    values = []
    for code in range(16):
        sign, exponent, mantissa = code >> 3, (code >> 1) & 3, code & 1
        magnitude = mantissa / 2 if exponent == 0 else 2.0 ** (exponent - 1) * (1 + mantissa / 2)
        values.append(-magnitude if sign else magnitude)
    return np.array(values, np.float32)


E2M1 = e2m1_table()


def mxfp4_values(rng, shape) -> np.ndarray:
    """Random float32 values MXFP4 holds exactly: an E2M1 value times a power of two shared by
    each block of 32 along the last axis."""
    codes = rng.integers(0, 16, shape)
    exponents = rng.integers(-8, 3, (*shape[:-1], shape[-1] // 32))
    return np.ldexp(E2M1[codes], np.repeat(exponents, 32, axis=-1)).astype(np.float32)


def pack_mxfp4(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``values [..., N]`` (exactly representable) as MXFP4 ``(blocks [..., N/32, 16], scales
    [..., N/32])``: per block the shared exponent is ``floor(log2(max |v|)) - 2`` (E2M1's largest
    exponent is 2), each value's E2M1 code, the even element in the low nibble."""
    groups = values.reshape(*values.shape[:-1], -1, 32).astype(np.float64)
    largest = np.max(np.abs(groups), axis=-1)
    shared = np.where(largest > 0, np.floor(np.log2(np.where(largest > 0, largest, 1))) - 2, 0)
    scaled = groups / np.exp2(shared)[..., None]
    magnitude = np.argmin(np.abs(np.abs(scaled)[..., None] - E2M1[:8]), axis=-1)
    codes = (magnitude | (np.signbit(scaled) << 3)).astype(np.uint8)  # -0.0 keeps its sign
    assert np.array_equal(E2M1[codes], scaled) and np.array_equal(
        np.signbit(E2M1[codes]), np.signbit(scaled)
    ), "pack_mxfp4 takes exactly representable values"
    blocks = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
    return blocks, (shared + 127).astype(np.uint8)


# ----------------------------------------------------------------------------- dequantization


def test_dequantize_known_bytes():
    # byte 0x2F: low nibble 0xF = -6.0 (element 0), high nibble 0x2 = +1.0 (element 1); the
    # rest 0x00; scale byte 128 = 2 ** 1.
    blocks = np.zeros((1, 1, 16), np.uint8)
    blocks[0, 0, 0] = 0x2F
    blocks[0, 0, 15] = 0x9B  # elements 30, 31: 0xB = -1.5, 0x9 = -0.5
    got = dequantize_mxfp4(blocks, np.full((1, 1), 128, np.uint8))
    want = np.zeros((1, 32), np.float32)
    want[0, :2] = [-12.0, 2.0]
    want[0, 30:] = [-3.0, -1.0]
    np.testing.assert_array_equal(got, want)
    assert got.dtype == np.float32


def test_dequantize_inverts_the_packer():
    values = mxfp4_values(np.random.default_rng(0), (3, 5, 96))
    blocks, scales = pack_mxfp4(values)
    assert blocks.shape == (3, 5, 3, 16) and scales.shape == (3, 5, 3)
    np.testing.assert_array_equal(dequantize_mxfp4(blocks, scales), values)


def test_dequantize_matches_transformers():
    torch = pytest.importorskip("torch")
    mxfp4 = pytest.importorskip("transformers.integrations.mxfp4")
    values = mxfp4_values(np.random.default_rng(1), (E, 2 * F, H))  # [E, out, in]
    blocks, scales = pack_mxfp4(values)
    theirs = mxfp4.convert_moe_packed_tensors(
        torch.from_numpy(blocks), torch.from_numpy(scales), dtype=torch.float32
    )  # gpt-oss's gate_up_proj: [E, in, out]
    ours = np.swapaxes(dequantize_mxfp4(blocks, scales), -1, -2)
    np.testing.assert_array_equal(theirs.numpy(), ours)
    np.testing.assert_array_equal(ours, np.swapaxes(values, -1, -2))


def test_dequantize_refuses_what_is_not_mxfp4():
    blocks, scales = np.zeros((2, 16), np.uint8), np.full((2,), 127, np.uint8)
    with pytest.raises(ValueError, match="scale byte 255"):
        dequantize_mxfp4(blocks, np.array([127, 255], np.uint8))
    with pytest.raises(ValueError, match=r"uint8 blocks \[..., G, 16\]"):
        dequantize_mxfp4(blocks.astype(np.int8), scales)
    with pytest.raises(ValueError, match=r"got blocks uint8 \[2, 8\]"):
        dequantize_mxfp4(blocks[:, :8], scales)


# ----------------------------------------------------------------------------- checkpoints


def _config(**changes) -> dict:
    with open(os.path.join(GOLDEN, "gpt_oss", "config.json")) as file:
        config = json.load(file)
    return {**config, "hidden_size": H, "intermediate_size": F, **changes}


def _write(directory, config, tensors):
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config))
    save_file(tensors, directory / "model.safetensors", {"format": "pt"})
    return directory


def _checkpoints(tmp_path, dense_dtype=np.float32):
    """A tiny gpt-oss layer twice: experts in MXFP4 (as on the Hub, with its
    quantization_config) and the same dequantized values dense. Returns both directories and
    the dense tensors."""
    rng = np.random.default_rng(2)
    gate_up = mxfp4_values(rng, (E, 2 * F, H))  # stored MXFP4 rows: [E, out, in]
    down = mxfp4_values(rng, (E, H, F))
    dense = {
        f"{PREFIX}.router.weight": rng.standard_normal((E, H), np.float32),
        f"{PREFIX}.router.bias": rng.standard_normal((E,), np.float32),
        f"{PREFIX}.experts.gate_up_proj_bias": rng.standard_normal((E, 2 * F), np.float32),
        f"{PREFIX}.experts.down_proj_bias": rng.standard_normal((E, H), np.float32),
    }
    dense = {key: value.astype(dense_dtype) for key, value in dense.items()}
    quantized = dict(dense)
    for name, values in (("gate_up_proj", gate_up), ("down_proj", down)):
        blocks, scales = pack_mxfp4(values)
        quantized[f"{PREFIX}.experts.{name}_blocks"] = blocks
        quantized[f"{PREFIX}.experts.{name}_scales"] = scales
        dense[f"{PREFIX}.experts.{name}"] = np.ascontiguousarray(
            np.swapaxes(values, -1, -2).astype(dense_dtype)
        )
    quantization = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router"],
    }
    mxfp4_dir = _write(tmp_path / "mxfp4", _config(quantization_config=quantization), quantized)
    dense_dir = _write(tmp_path / "dense", _config(), dense)
    return mxfp4_dir, dense_dir, dense


def _assert_same_params(got, want):
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_mxfp4_experts_load_dequantized(tmp_path):
    mxfp4_dir, dense_dir, dense = _checkpoints(tmp_path)
    cfg, params = jaxmoe.hf.load_moe_layer(mxfp4_dir, 0)
    dense_cfg, dense_params = jaxmoe.hf.load_moe_layer(dense_dir, 0)
    assert cfg == dense_cfg and cfg.dtype == jnp.float32
    _assert_same_params(params, dense_params)
    gate_up = dense[f"{PREFIX}.experts.gate_up_proj"]  # [E, H, 2F]: gate even, up odd columns
    np.testing.assert_array_equal(params["experts"]["w_gate"], gate_up[..., 0::2])
    np.testing.assert_array_equal(params["experts"]["w_up"], gate_up[..., 1::2])
    np.testing.assert_array_equal(params["experts"]["w_down"], dense[f"{PREFIX}.experts.down_proj"])
    x = jax.random.normal(jax.random.key(0), (2, 3, H))
    y, _ = jaxmoe.moe(params, x, cfg)
    want, _ = jaxmoe.moe(dense_params, x, dense_cfg)
    np.testing.assert_array_equal(y, want)


def test_mxfp4_experts_take_the_routers_dtype(tmp_path):
    mxfp4_dir, _, dense = _checkpoints(tmp_path, dense_dtype=ml_dtypes.bfloat16)
    cfg, params = jaxmoe.hf.load_moe_layer(mxfp4_dir, 0)
    assert cfg.param_dtype == jnp.bfloat16
    assert params["experts"]["w_up"].dtype == params["experts"]["b_up"].dtype == jnp.bfloat16
    gate_up = dense[f"{PREFIX}.experts.gate_up_proj"]  # exact in bfloat16 too
    np.testing.assert_array_equal(params["experts"]["w_up"], gate_up[..., 1::2])


def test_mxfp4_state_dict_is_dense(tmp_path):
    mxfp4_dir, _, dense = _checkpoints(tmp_path)
    cfg, params = jaxmoe.hf.load_moe_layer(mxfp4_dir, 0)
    back = jaxmoe.hf.moe_layer_state_dict(cfg, params, mxfp4_dir, 0)
    assert sorted(back) == sorted(dense)  # gate_up_proj / down_proj, no *_blocks / *_scales
    for key, value in dense.items():
        assert back[key].dtype == value.dtype and back[key].tobytes() == value.tobytes(), key


def test_mxfp4_mesh_load_reads_only_own_experts_blocks(tmp_path, monkeypatch):
    mxfp4_dir, _, _ = _checkpoints(tmp_path)
    _, params = jaxmoe.hf.load_moe_layer(mxfp4_dir, 0)
    reads = record_reads(monkeypatch)
    mesh = jax.make_mesh((8,), ("expert",))
    cfg, sharded = jaxmoe.hf.load_moe_layer(mxfp4_dir, 0, mesh=mesh)
    _assert_same_params(sharded, params)
    for leaf in sharded["experts"].values():
        for shard in leaf.addressable_shards:  # device d holds expert d
            assert shard.index[0] == slice(shard.device.id, shard.device.id + 1)
    quantized_reads = [(key, index) for key, index in reads if key.endswith(("_blocks", "_scales"))]
    # gate_up's blocks and scales once per half (gate, up), down's once: per expert, its own.
    assert len(quantized_reads) == 8 * (2 * 2 + 2)
    for key, index in quantized_reads:
        assert index[0].stop - index[0].start == 1, (key, index)
    assert sorted({index[0].start for _, index in quantized_reads}) == list(range(8))


def test_mxfp4_refuses_disagreeing_shapes_before_reading(tmp_path, monkeypatch):
    mxfp4_dir, _, _ = _checkpoints(tmp_path)
    config = json.loads((mxfp4_dir / "config.json").read_text())

    def refuse(*args, **kwargs):
        raise AssertionError("a tensor was read before the checks")

    monkeypatch.setattr(hf_checkpoint.CheckpointFiles, "read", refuse)
    (mxfp4_dir / "config.json").write_text(json.dumps({**config, "intermediate_size": 64}))
    with pytest.raises(ValueError, match=r"gate_up_proj_blocks' has shape \[8, 64, 1, 16\] but"):
        jaxmoe.hf.load_moe_layer(mxfp4_dir, 0)
    # F = 16: gate_up_proj's MXFP4 rows fit (its input is H = 32), down_proj's input cannot.
    tensors = load_file(mxfp4_dir / "model.safetensors")
    for name in ("gate_up_proj_blocks", "gate_up_proj_scales", "gate_up_proj_bias"):
        tensors[f"{PREFIX}.experts.{name}"] = tensors[f"{PREFIX}.experts.{name}"][:, :32]
    narrow = _write(tmp_path / "narrow", {**config, "intermediate_size": 16}, tensors)
    with pytest.raises(ValueError, match="down_proj' is stored in MXFP4.* input width of 16"):
        jaxmoe.hf.load_moe_layer(narrow, 0)
