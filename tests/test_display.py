"""gpzoo's figures display inline in IPython / Jupyter without pyplot."""

import numpy as np
import pytest

from gpzoo.analysis import calibration


def test_figures_render_as_png_in_an_ipython_shell():
    interactiveshell = pytest.importorskip("IPython.core.interactiveshell")
    shell = interactiveshell.InteractiveShell.instance()
    try:
        rng = np.random.default_rng(0)
        probs = rng.dirichlet(np.ones(2), 50)
        fig = calibration.reliability_figure(probs, rng.integers(0, 2, 50))
        data, _ = shell.display_formatter.format(fig)
        assert data["image/png"][:8] == b"\x89PNG\r\n\x1a\n"
    finally:
        interactiveshell.InteractiveShell.clear_instance()


def test_outside_ipython_nothing_is_registered():
    from gpzoo.analysis.display import register_inline_display  # noqa: PLC0415

    assert register_inline_display() is False
