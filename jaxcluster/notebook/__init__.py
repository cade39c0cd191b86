"""The IPython glue: parse, call the library, show what comes back; nothing but the public
surface imports it. It offers ``magics`` (what ``%load_ext jaxcluster`` loads), ``kernel`` (the
JAX Cluster kernel), ``kernelspec`` (its spec, for ``jaxcluster install-kernel``) and
``display`` (how a picture is shown: widget, HTML or text)."""

__all__ = ["display", "kernel", "kernelspec", "magics"]
