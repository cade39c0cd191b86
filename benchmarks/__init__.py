"""Benchmarks of jaxcluster against the hand-rolled ipyparallel recipes it replaces.

Run ``python -m benchmarks [startup] [spmd] [data] [scale] [hosts] [reads] [--repeat N]
[--sizes 1,4,16] [--quick]``; each benchmark writes a Markdown table to
``bench-results/<name>.md``, and ``bench-results/summary.md`` collects them.
"""

import os

# ipyparallel must never stop to ask a question while a benchmark is timing it
os.environ.setdefault("IPP_NONINTERACTIVE", "1")
