"""Device probe: torchtitan's import chain and the tiny layer against the plain torch peer."""

import sys
import traceback

import torch

try:
    import torchtitan.models.common.moe  # noqa: F401

    print("IMPORT OK", torchtitan.models.common.moe.__file__)
except Exception:
    traceback.print_exc()
    sys.exit(0)

import jax

import jaxmoe
from jaxmoe.bench import layer, torch_layer, torchtitan_layer
from jaxmoe.bench.presets import LAYER_PRESETS

try:
    p = LAYER_PRESETS["tiny"]
    cfg = layer.layer_config(p, jax.numpy.bfloat16)
    params = jax.device_get(jaxmoe.init_params(jax.random.key(0), cfg))
    x = jax.random.normal(jax.random.key(1), (p.tokens, p.hidden_size)).astype(jax.numpy.bfloat16)
    print("reason:", torchtitan_layer.unavailable_reason("cuda"))
    tt = torchtitan_layer.TorchTitanMoELayer(params, p.top_k, "cuda")
    pl = torch_layer.TorchMoELayer(params, p.top_k, torch.bfloat16, "cuda")
    tx = torch_layer.to_torch_input(jax.device_get(x), torch.bfloat16, "cuda").requires_grad_(True)
    y1 = tt(tx)
    y2 = pl(tx)
    print(
        "y diff", ((y1.float() - y2.float()).norm() / y2.float().norm()).item(), y1.dtype, y1.shape
    )
    g = torch.autograd.grad(y1, [tx, *tt.parameters()], torch.ones_like(y1))
    print("grads", [tuple(t.shape) for t in g])
    print([n for n, _ in tt.named_parameters()], [n for n, _ in tt.named_buffers()])
except Exception:
    traceback.print_exc()
