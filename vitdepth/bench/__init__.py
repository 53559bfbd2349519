"""``vitdepth bench``: speed figures against their targets, measured side by side in one process.

    vitdepth bench --out results/bench              # CPU, full sizes (minutes)
    vitdepth bench --quick --out /tmp/bench         # tiny sizes: checks the code, not the speed
    vitdepth bench --device cuda --out results/bench/h200

One module a section, each defining its figures beside the code that measures them: ``training``
(a), ``callback`` (b), ``metric_cost`` and ``scaling`` (c), ``loaders`` (d), ``flops`` (e, f).
Shared: ``figure`` (Figure, Section, Bench), ``plan`` (sizes), ``timing`` (windows, interleaved
rounds, paired medians, profiles), ``loops`` (the Lightning and bare loops and the references
timed between their windows). ``suite`` runs the sections; ``report`` formats them; ``cli``.
"""
