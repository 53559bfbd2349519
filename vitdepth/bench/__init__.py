"""``vitdepth bench`` (usage in ``cli``): one module per kind of measurement, each defining its
figures beside the code that measures them: ``training`` (a, b), ``metric_cost`` (c), ``loaders``
(d), ``flops`` (e, f). Shared: ``figure`` (Figure, Section, Bench, tables), ``plan`` (sizes),
``timing`` (the one clock), ``loops`` (the loops and references timed). ``suite`` runs the
sections, ``report`` formats their results."""
