"""``python -m jaxmoe``: the same command line as ``jaxmoe`` (see :mod:`jaxmoe.cli.main`)."""

import sys

from jaxmoe.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
