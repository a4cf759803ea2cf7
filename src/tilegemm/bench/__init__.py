"""tilegemm-bench: the one benchmark harness (``tilegemm-bench`` / ``python -m tilegemm.bench`` / ``make bench``).

One module per family (``dense``, ``m_grouped``, ``masked``, ``k_grouped``, ``mqa``, ``moe``, and ``models``:
whole HF MoE models, patched vs stock), each with ``specs(size)`` (the rows of a ``quick`` / ``full`` run)
and ``case(spec, dg, dg_reason)`` (a :class:`~tilegemm.bench.core.Case`); shared modules: ``core`` (one
row: correctness, eager, kernel-only and first-call times of tilegemm and each peer), ``timing``,
``device`` (machine and ceilings), ``peers`` (cuBLAS helpers, DeepGEMM loading), ``schema`` (results
file), ``report`` (markdown), ``compare`` (baseline ratios, regression gate), ``plots`` (matplotlib,
optional), ``readme`` (the README's results section), ``progress``, ``runner``.
Nothing here imports matplotlib or tqdm unless plotting / a progress bar is asked for.
"""
