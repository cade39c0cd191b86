"""Pure renderers: plain data (from :mod:`jaxcluster.layout`) to HTML and text.

Nothing here imports JAX, IPython or ipywidgets, so every renderer is tested directly.
"""
