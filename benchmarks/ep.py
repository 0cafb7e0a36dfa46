"""Expert-parallel benchmark: correctness, exchange bandwidth, layer weak scaling.

Any EP sizes (the script uses the first EP devices for each)::

    python benchmarks/ep.py --ep 1,2,4 --out benchmarks/results --stem ep-h200
    XLA_FLAGS=--xla_force_host_platform_device_count=8 JAX_PLATFORMS=cpu \
        python benchmarks/ep.py --ep 1,2,4,8 --tiny --out /tmp/ep   # CPU smoke test

See :mod:`jaxmoe.bench.ep` for what each part measures.
"""

import sys

from jaxmoe.bench.ep import main

if __name__ == "__main__":
    main(sys.argv[1:])
