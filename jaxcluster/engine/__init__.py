"""Everything that runs on an engine, inside one JAX process; the notebook sends these modules'
functions by reference, so the engines import them from the same installation. It offers
``process`` (where the engine runs, its rank, ``jax.distributed``, its devices), ``forking``
(local engines forked from one process that imported JAX once), ``cells`` (a cell asked through
the inbox, and the notebook's cell numbers in tracebacks), ``inbox`` (the socket the notebook on
this host reaches it through), ``dispatch`` (the multi-process programs it ran in this cell),
``values`` (global arrays' printouts), ``data`` (its side of pull and push), ``sharding``
(sharding pictures, one bundle per cell) and ``introspect`` (completion and ``x?`` for the
kernel); ``__main__`` is the entry point every launcher runs, ``python -m jaxcluster.engine``.
Nothing here imports client state, and IPython only where the engine's own shell is needed."""

__all__ = [
    "cells",
    "data",
    "dispatch",
    "forking",
    "inbox",
    "introspect",
    "process",
    "sharding",
    "values",
]
