"""What runs on an engine, in one JAX process; the notebook sends these modules' functions by
reference. It offers ``process``, ``topology``, ``bootstrap``, ``forking``, ``imports``, ``cells``,
``inbox``, ``backchannel``, ``dispatch``, ``jax_internals``, ``values``, ``data``, ``sharding``,
``stdin``, ``sigint``, ``sync``, ``scripts`` and ``introspect``; ``__main__`` is what every launcher runs (``python -m
jaxcluster.engine``). IPython only where the engine's own shell is needed."""

__all__ = [
    "backchannel",
    "bootstrap",
    "cells",
    "data",
    "dispatch",
    "forking",
    "imports",
    "inbox",
    "introspect",
    "jax_internals",
    "process",
    "scripts",
    "sharding",
    "sigint",
    "stdin",
    "sync",
    "topology",
    "values",
]
