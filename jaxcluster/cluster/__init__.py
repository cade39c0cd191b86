"""Cluster lifecycle: a controller and one ipyparallel engine per JAX process, started (or
connected to), restarted and stopped, with nothing left running, and asked about themselves.
It offers ``facade`` (``JaxCluster``, the object every other part is handed), ``options``
(validated settings and every default), ``launchers`` (what ``--launcher`` may name) and
``queries`` (device records and array layouts, asked of the processes); bring-up,
``jax.distributed``, hosts, forked local engines, engine sets, the watchdog, ``connect``, the
event-loop thread, health and bounded waits are its own."""

__all__ = ["facade", "launchers", "options", "queries"]
