"""Cluster lifecycle: a controller and one engine per JAX process, started or connected to,
restarted, stopped with nothing left running, and asked about themselves. It offers ``facade``
(``JaxCluster``), ``option_table`` (each option, declared once), ``options`` (all checked
together), ``launchers`` (what ``--launcher`` names), ``queries`` (devices and array layouts),
``kept`` (kept clusters, listed and stopped) and ``published`` (running ones, for the panel)."""

__all__ = ["facade", "kept", "launchers", "option_table", "options", "published", "queries"]
