"""Everything that runs on an engine, i.e. inside one JAX process.

The notebook sends these modules' functions by reference, so engines import them from the same
installation. Nothing here imports client state; IPython is imported lazily, only where the
engine's own shell is needed (displays, completion).

- ``__main__``: the entry point every launcher runs (``python -m jaxcluster.engine``).
- ``process``: where the engine runs, its rank, ``jax.distributed`` on it, its devices.
- ``data``: the engine side of pull and push (export shards, receive slices, stage, commit, undo).
- ``sharding``: sharding pictures published as one bundle per cell.
- ``introspect``: completion and inspection for the kernel, from process 0's namespace.
"""
