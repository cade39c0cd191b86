"""What runs on an engine, in one JAX process; the notebook sends these modules' functions by
reference. It offers ``process``, ``topology``, ``bootstrap``, ``forking``, ``imports``, ``cells``,
``calls``, ``inbox``, ``backchannel``, ``dispatch``, ``values``, ``data``, ``sharding``, ``stdin``,
``sigint``, ``sync``, ``scripts``, ``introspect``, ``session`` (the hooks, installed in one order),
and one adapter per library whose internals it uses: ``jax_internals``, ``ipython_internals``,
``ipykernel_internals``, ``ipyparallel_internals``; ``__main__`` is every launcher's entry point
(``python -m jaxcluster.engine``). IPython only where the engine's shell is needed."""

__all__ = [
    "backchannel",
    "bootstrap",
    "calls",
    "cells",
    "data",
    "dispatch",
    "forking",
    "imports",
    "inbox",
    "introspect",
    "ipykernel_internals",
    "ipyparallel_internals",
    "ipython_internals",
    "jax_internals",
    "process",
    "scripts",
    "session",
    "sharding",
    "sigint",
    "stdin",
    "sync",
    "topology",
    "values",
]
