"""The controller's entry point: ``python -m jaxcluster.cluster.controller`` runs ipyparallel's
controller, its imports made without garbage collection (as the forking process makes its own,
``engine/forking.py``: each pass would scan every object imported so far again, about 15% of
their CPU) and frozen afterwards, so that the controller's collections leave them alone; without
numpy, and with the installed entry points read once (``engine/imports.py``)."""

from __future__ import annotations

import gc

from ..engine import imports


def main() -> None:
    gc.disable()
    with imports.without("numpy"), imports.entry_points_read_once():
        from ipyparallel.controller.app import main as controller_main

    gc.freeze()
    gc.enable()
    controller_main()


if __name__ == "__main__":
    main()
