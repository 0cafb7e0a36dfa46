"""Benchmarks, run by ``jaxmoe bench gemm|layer|ep`` (:mod:`jaxmoe.cli.main`).

- ``harness``: what every bench shares: results header, relative error, ratio rule, table, writer.
- ``presets``: the shapes, declared once for tests, benches and scripts; ``timing``: device-synced
  timing.
- grouped matmul: ``gemm`` (the benchmark), ``gemm_cases`` (each implementation, checked against
  a reference), ``gemm_tile_sweep`` (Pallas Triton tile sweep).
- the layer: ``layer`` (jaxmoe against dense JAX and ``torch_layer``, a PyTorch layer).
- expert parallelism: ``expert_parallel`` (the driver), ``sharded_correctness``,
  ``exchange_bandwidth``, ``layer_scaling``; ``hlo_schedule`` reads what XLA scheduled around
  each exchange in a compiled module's HLO.
"""
