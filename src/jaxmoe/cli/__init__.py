"""The ``jaxmoe`` command line: ``demo`` (train a small MoE language model) and ``bench``."""
