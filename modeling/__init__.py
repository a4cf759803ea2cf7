"""Harnesses beside the library (not part of the ``tilegemm`` package): the op demo and the transformers CLIs."""
