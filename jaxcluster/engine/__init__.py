"""What runs on an engine, in one JAX process; the notebook sends these modules' functions by
reference. It offers ``process``, ``topology``, ``bootstrap``, ``forking``, ``imports``, ``cells``,
``calls``, ``link_end`` (its end of the link), ``dispatch``, ``values``,
``data``, ``sharding``, ``stdin``, ``sigint``, ``sync``, ``scripts``, ``tracebacks`` (the
stack JAX records in a cell), ``introspect``, ``state`` (a process's state across a restart),
``profile`` (a profiled cell's traces), ``session`` (the hooks, installed in one order),
and one adapter per library whose internals it uses: ``jax_internals``, ``ipython_internals``,
``ipykernel_internals``, ``ipyparallel_internals``; ``__main__`` is every launcher's entry point
(``python -m jaxcluster.engine``). IPython only where the engine's shell is needed."""

__all__ = [
    "bootstrap",
    "calls",
    "cells",
    "data",
    "dispatch",
    "forking",
    "imports",
    "introspect",
    "ipykernel_internals",
    "ipyparallel_internals",
    "ipython_internals",
    "jax_internals",
    "link_end",
    "process",
    "profile",
    "scripts",
    "session",
    "sharding",
    "sigint",
    "state",
    "stdin",
    "sync",
    "topology",
    "tracebacks",
    "values",
]
