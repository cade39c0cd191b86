"""The JAX Cluster kernel's own magics: ``%%local``, and ``x?`` / ``x??`` from process 0."""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any

from IPython.core import page
from IPython.core.error import UsageError
from IPython.core.inputtransformer2 import TransformerManager
from IPython.core.interactiveshell import InteractiveShell
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class

from ..engine.introspect import inspect_name
from .kernel_cells import help_request


@magics_class
class KernelMagics(Magics):
    """``%%local``, and ``x?`` / ``x??`` that look at process 0 while a cluster runs.

    ``ask_process0(func, *args)`` runs ``func`` on process 0 and returns its result, or None
    when no cluster runs or process 0 does not answer (the kernel's ``ask_process0``).
    """

    def __init__(self, shell: InteractiveShell, ask_process0: Callable[..., Any]) -> None:
        super().__init__(shell)
        self.ask_process0 = ask_process0
        # IPython's own help magics, for names process 0 does not know and for wildcards
        self._local_pinfo = {name: shell.find_line_magic(name) for name in ("pinfo", "pinfo2")}

    @cell_magic
    def local(self, line: str, cell: str) -> Any:
        """Run this cell in the notebook's own process, not on the JAX processes.

        In the JAX Cluster kernel every plain cell runs on every process once a cluster runs;
        a cell that starts with %%local runs here instead, like in a plain IPython kernel::

            %%local
            import matplotlib.pyplot as plt
            plt.plot(losses)
        """
        if line.strip():
            raise UsageError("%%local takes no options; put the cell's code on the lines below it.")
        # The kernel's transformer runs a cell that starts with %%local as a plain local cell,
        # so this only runs when called another way (e.g. run_cell_magic): exec the code and
        # return its last expression, which IPython then shows as the value.
        # A fresh manager: IPython's syntax without this kernel's own transformer.
        tree = ast.parse(TransformerManager().transform_cell(cell))
        final = tree.body[-1] if tree.body else None
        value = final.value if isinstance(final, ast.Expr) else None
        if value is not None:
            tree.body.pop()
        assert self.shell is not None  # set by __init__; IPython's own idiom for its Optional
        ns = self.shell.user_ns
        exec(compile(tree, "<%%local>", "exec"), ns)
        if value is not None:
            return eval(compile(ast.Expression(value), "<%%local>", "eval"), ns)
        return None

    @line_magic
    def pinfo(self, parameter_s: str = "", namespaces: Any = None) -> None:
        """Show an object's information (``x?``); from process 0 while a cluster runs."""
        self._pinfo("pinfo", parameter_s, namespaces, 0)

    @line_magic
    def pinfo2(self, parameter_s: str = "", namespaces: Any = None) -> None:
        """Show an object's information and source (``x??``); from process 0 if a cluster runs."""
        self._pinfo("pinfo2", parameter_s, namespaces, 1)

    def _pinfo(self, magic: str, parameter_s: str, namespaces: Any, level: int) -> None:
        name, level = help_request(parameter_s, level)
        bundle = None
        if namespaces is None and "*" not in name and name:
            bundle = self.ask_process0(inspect_name, name, len(name), level)
        if bundle is None:
            self._local_pinfo[magic](parameter_s, namespaces)
            return
        assert self.shell is not None
        if not self.shell.enable_html_pager:
            bundle.pop("text/html", None)
        page.page(bundle)
