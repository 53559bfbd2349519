"""``vitdepth bench``: speed figures against their targets, measured side by side in one process.

    vitdepth bench --out results/bench              # CPU, full sizes (minutes)
    vitdepth bench --quick --out /tmp/bench         # tiny sizes: checks the code, not the speed
    vitdepth bench --device cuda --out results/bench/h200

One module a section, each defining its figures (name, target, known cause, profile on a miss)
beside the code that measures them: ``training`` (a: Lightning vs bare, our block vs timm's),
``callback`` (b), ``metric_cost`` and ``scaling`` (c), ``loaders`` (d), ``flops`` (e), ``gpu``
(f). Shared: ``figure`` (Figure, Section, Bench), ``plan`` (sizes), ``timing`` (warm-up, windows,
medians), ``loops`` (the Lightning and bare training loops), ``profiling``. ``suite`` runs the
sections in order; ``report`` lays them out (bench.json, bench.md, scaling.png); ``cli``.
"""
