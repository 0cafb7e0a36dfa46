"""The Mosaic GPU engine that the grouped matmul, the gated FFN and the FP8 grouped matmul share
on Hopper: a persistent, warp-specialized ``gmm`` and ``tgmm`` (wgrad). Nothing is imported
here; each op's backend file imports the modules it needs (see docs/design.md)."""
