"""Pure presentation: plain data to text and HTML, and the words every output is labelled with.
It offers ``layout`` (devices and shardings as plain data, from metadata only, on an engine or
here), ``labels`` (``[processes 0-3]`` and back, and equal outputs collapsed under one label),
``cell`` (a cell's output groups, live view and error report), ``sharding`` (the one sharding
picture), ``devices``, ``status`` and ``transfer``; its table and grid are its own. Nothing here
imports IPython or ipywidgets, or JAX until ``layout`` is handed a JAX object, so every renderer
is tested directly."""

__all__ = ["cell", "devices", "labels", "layout", "sharding", "status", "transfer"]
