"""Cluster lifecycle: a controller and one engine per JAX process, started or connected to,
restarted, stopped with nothing left running, and asked about themselves. It offers ``facade``
(``JaxCluster``), ``options`` (settings and their defaults), ``launchers`` (what ``--launcher``
names) and ``queries`` (devices and array layouts, asked of the processes)."""

__all__ = ["facade", "launchers", "options", "queries"]
