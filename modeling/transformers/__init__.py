"""Patched-vs-stock HuggingFace MoE inference: presets, measurements, report tables and the ``infer.py`` CLI.

Run from the repository root: ``python modeling/transformers/infer.py --help``.
"""
