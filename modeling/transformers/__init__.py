"""Patched-vs-stock HuggingFace MoE inference: measurements, report tables and the ``infer.py`` CLI (the model
presets are :mod:`tilegemm.transformers.presets`, shared with ``tilegemm-bench``'s ``models`` family).

Run from the repository root: ``python modeling/transformers/infer.py --help``.
"""
