"""Expert-parallel benchmark: correctness of every exchange, exchange bandwidth, layer weak scaling.

The same as ``jaxmoe bench ep`` (flags: ``jaxmoe bench ep --help``); any EP sizes (the first EP
devices are used for each)::

    python benchmarks/expert_parallel.py --ep 1,2,4 --out /tmp/ep.json
    python benchmarks/expert_parallel.py --ep 1,2,4,8 --preset tiny --out /tmp/ep.json  # CPU

See :mod:`jaxmoe.bench.expert_parallel` for what each part measures.
"""

import sys

from jaxmoe.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["bench", "ep", *sys.argv[1:]]))
