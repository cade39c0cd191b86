"""Cluster lifecycle: a controller and one engine per JAX process, started or connected to,
restarted, stopped with nothing left running, and asked about themselves. It offers ``facade``
(``JaxCluster``), ``option_table`` (each option, declared once), ``options`` (all checked
together), ``launchers`` (what ``--launcher`` names) and ``queries`` (devices and array layouts)."""

__all__ = ["facade", "launchers", "option_table", "options", "queries"]
