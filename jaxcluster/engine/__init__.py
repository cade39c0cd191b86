"""What runs on an engine, in one JAX process; the notebook sends these modules' functions by
reference. It offers ``process``, ``topology``, ``bootstrap``, ``forking``, ``imports``, ``cells``,
``calls``, ``inbox``, ``backchannel``, ``dispatch``, ``jax_internals``, ``values``, ``data``,
``sharding``, ``stdin``, ``sigint``, ``sync``, ``scripts``, ``introspect``; ``__main__`` is every
launcher's entry point (``python -m jaxcluster.engine``). IPython only where the shell is needed."""

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
