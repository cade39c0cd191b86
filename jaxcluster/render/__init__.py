"""Pure presentation: plain data to text and HTML, and the labels every output carries. It
offers ``layout`` (devices and shardings as plain data, from metadata), ``labels``
(``[processes 0-3]``, equal outputs collapsed), ``cell``, ``sharding``, ``devices``, ``status``,
``live`` (the panel's rows), ``transfer`` and ``profile`` (a profiled cell's summary). No
IPython, no ipywidgets, and JAX only in ``layout``: every renderer is tested directly."""

__all__ = ["cell", "devices", "labels", "layout", "live", "profile", "sharding", "status",
           "transfer"]
