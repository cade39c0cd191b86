"""The IPython glue, and the only part that imports IPython besides the engines: it parses,
calls the library and shows what comes back, with no logic of its own. It offers ``magics``
(the extension that ``%load_ext jaxcluster`` loads), ``kernel`` (the JAX Cluster kernel, run as
``python -m jaxcluster.notebook.kernel``), ``kernelspec`` (its spec, written by ``jaxcluster
install-kernel``) and ``display`` (the one place that decides how a picture is shown); the
magics' arguments, the data magics, the sharding widget and the kernel's own cells and magics
are its own. Nothing outside it imports it but the package's public surface."""

__all__ = ["display", "kernel", "kernelspec", "magics"]
