"""Benchmarks, run by ``jaxmoe bench KIND`` (:mod:`jaxmoe.cli.main`,
:mod:`jaxmoe.cli.bench_commands`).

- ``harness``: what every bench shares: results header, relative error, ratio rule, table, writer.
- ``presets``: the shapes, declared once for tests, benches and scripts; ``timing``: device-synced
  timing.
- grouped matmul: ``gemm`` (the benchmark), ``gemm_cases`` (each implementation, checked against
  a reference), ``gemm_tile_sweep`` (Pallas Triton tile sweep).
- the layer: ``layer`` (jaxmoe against dense JAX and ``torch_layer``, a PyTorch layer).
- expert parallelism: ``expert_parallel`` (the driver), ``sharded_correctness``,
  ``exchange_bandwidth``, ``layer_scaling``; ``hlo_schedule`` reads what XLA scheduled around
  each exchange in a compiled module's HLO; ``ep_memory`` (the EP layer's planned temporaries).
- FP8: ``fp8_gemm`` (the FP8 grouped matmul against torch's), ``fp8_wgrad`` (the FP8 weight
  gradient), ``fp8_quantize`` (the quantizers against XLA's).
- the layer's time: ``layer_profile`` (kernel time per XLA op), ``layer_api`` (the public API
  timed as users write it), ``kernel_profile`` (reading a profiler trace).
- before and after a change: ``ab`` (two source trees, bitwise compared then timed in
  interleaved rounds), ``ab_worker`` (the script each tree's process runs), ``ab_pipe`` (the
  parent's end of its pipe), ``ab_trees`` (the trees: a folder or an exported commit).
"""
