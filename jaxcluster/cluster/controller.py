"""The controller's entry point: ``python -m jaxcluster.cluster.controller`` runs ipyparallel's
controller, its imports made without garbage collection (as the forking process makes its own,
``engine/forking.py``: each pass would scan every object imported so far again, about 15% of
their CPU) and frozen afterwards, so that the controller's collections leave them alone."""

from __future__ import annotations

import gc


def main() -> None:
    gc.disable()
    from ipyparallel.controller.app import main as controller_main

    gc.freeze()
    gc.enable()
    controller_main()


if __name__ == "__main__":
    main()
