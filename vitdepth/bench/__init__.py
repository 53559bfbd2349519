"""``vitdepth bench``: speed figures against their targets, measured side by side in one process.

    vitdepth bench --out results/bench                  # CPU, full sizes (minutes)
    vitdepth bench --quick --out /tmp/bench             # tiny sizes: checks the code, not the speed
    vitdepth bench --device cuda --out results/bench/h200

Modules, one job each: ``plan`` (sizes), ``timing`` (warm-up, windows, medians), ``training``
(a, e, f), ``probe_cost`` (b, c), ``loaders`` (d), ``profiling`` (profiles of misses), ``suite``
(runs them in order), ``report`` (bench.json, bench.md, scaling.png), ``cli``.
"""
