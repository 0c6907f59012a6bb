"""Figures of fitted models (matplotlib ``Figure`` objects; nothing is shown or saved here)."""

from __future__ import annotations

import math

import numpy as np
from matplotlib.figure import Figure

from gpzoo.analysis.display import new_figure
from gpzoo.inference.components import inducing_patch_outputs
from gpzoo.models.errors import InvalidArgumentError

__all__ = ["inducing_patches_figure"]


def inducing_patches_figure(res, *, latent: int = 0, group: int = 0, ncols: int | None = None,
                            panel_size: float = 1.0) -> Figure:
    """The learned inducing patches sorted by their inducing output E_q[u] (van der Wilk et al. 2017, fig. 1).

    Patches with the largest output (evidence for the positive class / larger f) come first.
    ``latent`` picks the latent function (multi-class models), ``group`` the output group
    (the channel function of the multi-channel kernel). Grey patches share one colour scale;
    colour patches are shown as RGB, rescaled to [0, 1] together.
    """
    found = inducing_patch_outputs(res)
    patches, outputs = found.patches, found.outputs  # [M, h, w, c], [G, M, L]
    G, M, L = outputs.shape
    if not 0 <= group < G:
        raise InvalidArgumentError("group", f"must be in [0, {G}), got {group}")
    if not 0 <= latent < L:
        raise InvalidArgumentError("latent", f"must be in [0, {L}), got {latent}")
    order = np.argsort(-outputs[group, :, latent])  # [M]
    ncols = ncols or math.ceil(math.sqrt(M))
    nrows = math.ceil(M / ncols)
    # a fixed grid (no constrained layout: solving it for dozens of panels costs about a second)
    fig = new_figure(figsize=(panel_size * ncols, panel_size * nrows * 1.15 + 0.45))
    axes = fig.subplots(nrows, ncols, squeeze=False,
                        gridspec_kw={"left": 0.02, "right": 0.98, "bottom": 0.02, "top": 1.0 - 0.45 / fig.get_figheight(),
                                     "wspace": 0.15, "hspace": 0.35})
    lo, hi = float(patches.min()), float(patches.max())
    for ax in axes.flat:
        ax.set_axis_off()
    for ax, m in zip(axes.flat, order):
        patch = patches[m]  # [h, w, c]
        if patch.shape[-1] == 1:
            ax.imshow(patch[..., 0], cmap="gray", vmin=lo, vmax=hi, interpolation="nearest")
        else:
            rgb = (patch[..., :3] - lo) / max(hi - lo, 1e-12)  # [h, w, 3]
            ax.imshow(np.clip(rgb, 0.0, 1.0), interpolation="nearest")
        ax.set_title(f"{outputs[group, m, latent]:+.2f}", fontsize=7)
    fig.suptitle(f"{res.spec.name}: inducing patches by E[u]", fontsize=9)
    return fig
