"""gpzoo's figures in notebooks.

gpzoo builds its figures as plain :class:`matplotlib.figure.Figure` objects, never through pyplot,
so that scripts and reports hold no global figure state. IPython shows a figure inline only where a
PNG formatter is registered for ``Figure``, which matplotlib's inline backend does once pyplot is
imported. :func:`new_figure` therefore registers a formatter itself when it runs inside IPython
(Jupyter, ``ipython``), so a cell that ends in a gpzoo figure displays the image whether or not
the notebook ever imported pyplot. Outside IPython it does nothing beyond making the figure.
"""

from __future__ import annotations

import io

from matplotlib.figure import Figure

__all__ = ["figure_png", "new_figure", "register_inline_display"]

#: Resolution of the inline PNG (matplotlib's inline backend uses 72-100).
INLINE_DPI = 90


def figure_png(fig: Figure, dpi: int = INLINE_DPI) -> bytes:
    """The figure as PNG bytes, trimmed to its drawn extent."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    return buffer.getvalue()


def register_inline_display() -> bool:
    """Register a PNG formatter for ``Figure`` in the running IPython shell (if any, and if none is
    registered yet). Returns whether figures now display inline there."""
    try:
        from IPython import get_ipython  # noqa: PLC0415 - optional: only inside IPython
    except ImportError:
        return False
    shell = get_ipython()
    if shell is None:
        return False
    formatter = shell.display_formatter.formatters["image/png"]
    try:
        formatter.lookup_by_type(Figure)
    except KeyError:
        formatter.for_type(Figure, figure_png)
    return True


def new_figure(**kwargs) -> Figure:
    """``Figure(**kwargs)`` that displays inline when returned to a notebook cell."""
    register_inline_display()
    return Figure(**kwargs)
