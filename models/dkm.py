"""The architecture of a deep kernel machine (Milsom, Anson, Aitchison 2024, §2, Algorithm 1, App. A).

What a DKM *is*: its Gram layers (widths P_ℓ, conv filters and strides, batch kernel
normalisation, skip connections), the kernel nonlinearity, the output likelihood, and the
regularisers of its objective (ν, SKR's γ and λ, the KL form). The program that computes with it
is :mod:`gpzoo.inference.dkm`; the zoo entries ``dkm`` and ``conv-dkm`` build one
(:mod:`gpzoo.models.zoo_dkm`) and it is the ``architecture`` of their :class:`~gpzoo.models.zoo_core.ModelSpec`
(whose ``kernel`` is None); :func:`gpzoo.models.zoo_dkm.architecture_spec` makes the spec of any other.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax


from gpzoo.models.errors import InvalidArgumentError, ShapeError, as_float_array, check_integer, check_real
from gpzoo.models.kernels.gram import GRAM_KERNELS

__all__ = ["DKMConfig", "GramLayerSpec", "KL_FORMS"]

KL_FORMS = ("exact", "taylor_symmetric", "taylor_frobenius", "milsom_eq8")


@dataclasses.dataclass(frozen=True)
class GramLayerSpec:
    """One Gram layer: ``num_inducing`` P_ℓ; for conv layers a mixing filter and stride.

    ``batch_norm`` adds batch kernel normalisation after the layer; ``skip_from`` (an earlier
    layer index, −1 for the input Gram) averages this layer's output with that one's
    (through a learned 1×1 mixing when the shapes differ), the DKM skip connection (§4.1).
    """

    num_inducing: int
    filter_shape: tuple[int, int] = (3, 3)
    stride: int = 1
    batch_norm: bool = False
    skip_from: int | None = None


@dataclasses.dataclass(frozen=True, eq=False)
class DKMConfig:
    """Static description of a DKM (architecture, kernel, regularisers, numerics).

    architecture: ``"fc"`` (inputs ``[N, ν₀]``) or ``"conv"`` (inputs ``[N, H, W, C]``).
    num_input_inducing: P₀ of the input Gram (inducing inputs; conv: inducing patches of
      ``stem_patch_shape``); default the first layer's width.
    head (conv): ``"gap"`` (global average pooling, Milsom et al. 2024, Alg. 1) or ``"flatten"``
      (a learned readout mixing over all locations, ``head_inducing`` outputs).
    kernel: ``"arccos"`` or ``"normalised_gaussian"``; ``kernel_bias``: initial bias.
    nu: ν per layer (one float for all); skr: Wishart sampling on/off in training;
    skr_gamma: γ (None: ceil(P_ℓ/4)); skr_jitter: λ, added to G̃ in training and test alike
    (``skr=False`` with λ > 0 is the paper's "no SKR but keep jitter" ablation). kl: one of :data:`KL_FORMS` (see :func:`gram_kl`).
    output_kl_weight: w_out, the weight of the output layer's KL (1: untempered, eq. 14). kernel_jitter: added to every K_ii as
    ``kernel_jitter · mean(diag K_ii) · I`` (named and reported in ``aux["jitter"]``). Its default
    1e-4 is a training-stability setting, not only a factorisation guard: the learned factor V of
    G = V Vᵀ starts at chol(K_ii), whose smallest diagonal entries are ≈ √kernel_jitter · √mean(diag K)
    for the (typically numerically low-rank) kernels of a DKM, while Adam moves every
    off-diagonal entry of V by about ``learning_rate/√P`` per step whatever its gradient. When that
    step is as large as the small diagonal entries V becomes a triangular matrix with off-diagonals
    ≫ diagonal, whose inverse grows exponentially with P. Measured on the one-layer toy of
    Milsom et al. 2024, §4.2 (P = 100, squared-exponential kernel, float64, Adam lr 0.01, ν = 0):
    with 1e-6, cond(G) went from 4e7 at the start to 2.5e38 after 25 steps (the Taylor KL's loss then
    reached 1e34 at ν = 1e-6); with 1e-4 it was 4e5 at the start and 1.3e10 after 100 steps, and
    ν = 1e-6 with the Taylor KL held it near 1e6 for 600 steps. The authors' public implementation
    stabilises every kernel with (1 + 1e-4)·diag + 1e-4, about 2e-4 relative for unit diagonals.
    residual_tol: relative tolerance of negative Nyström residuals (None: 10·√eps of the dtype).
    record_condition: also compute cond(G_ii) inside the traced program (an SVD per layer, which
    roughly doubles compile time); ``gpzoo.fit`` records them on the host instead, at the start and
    the end of a fit (``FitResult.diagnostics["gram_condition"]``).
    image_shape (conv): ``(H, W)`` or ``(H, W, C)`` of the images when inputs come flattened
    ``[N, H·W·C]`` (as ``gpzoo.fit`` passes them; :meth:`network_inputs`).
    """

    layers: tuple[GramLayerSpec, ...]
    likelihood: Any
    num_outputs: int
    architecture: str = "fc"
    num_input_inducing: int | None = None
    stem_patch_shape: tuple[int, int] = (3, 3)
    head: str = "gap"
    head_inducing: int | None = None
    kernel: str = "arccos"
    kernel_bias: float = 0.1
    nu: float | tuple[float, ...] = 1e-3
    skr: bool = True
    skr_gamma: int | tuple[int, ...] | None = None
    skr_jitter: float = 0.1
    kl: str = "taylor_symmetric"
    output_kl_weight: float = 1.0
    kernel_jitter: float = 1e-4
    residual_tol: float | None = None
    batch_norm_mode: str = "local"
    record_condition: bool = False
    image_shape: tuple[int, ...] | None = None

    def __post_init__(self):
        object.__setattr__(self, "layers", tuple(self.layers))
        if not self.layers:
            raise InvalidArgumentError("layers", "a DKM needs at least one Gram layer")
        for name, value, allowed in (
            ("architecture", self.architecture, ("fc", "conv")),
            ("head", self.head, ("gap", "flatten")),
            ("kernel", self.kernel, tuple(GRAM_KERNELS)),
            ("kl", self.kl, KL_FORMS),
            ("batch_norm_mode", self.batch_norm_mode, ("local", "image")),
        ):
            if value not in allowed:
                raise InvalidArgumentError(name, f"must be one of {allowed}, got {value!r}")
        for i, spec in enumerate(self.layers):
            if spec.num_inducing < 1:
                raise InvalidArgumentError(f"layers[{i}].num_inducing", f"must be >= 1, got {spec.num_inducing}")
            if spec.skip_from is not None and not -1 <= spec.skip_from < i:
                raise InvalidArgumentError(f"layers[{i}].skip_from", f"must be in [-1, {i - 1}], got {spec.skip_from}")
            if self.architecture == "conv" and any(k % 2 == 0 for k in spec.filter_shape):
                raise InvalidArgumentError(f"layers[{i}].filter_shape", f"must be odd, got {spec.filter_shape}")
            if self.architecture == "conv":
                for k in spec.filter_shape:
                    check_integer(k, f"layers[{i}].filter_shape", minimum=1)
            check_integer(spec.stride, f"layers[{i}].stride", minimum=1)
        if self.head == "flatten" and self.architecture == "conv" and not self.head_inducing:
            raise InvalidArgumentError("head_inducing", "the flatten head needs its number of inducing outputs")
        for name in ("num_outputs", "num_input_inducing", "head_inducing"):
            if name == "num_outputs" or getattr(self, name) is not None:
                check_integer(getattr(self, name), name, minimum=1)
        for name in ("skr_jitter", "kernel_jitter", "kernel_bias", "output_kl_weight"):
            _check_at_least_zero(getattr(self, name), name)
        for value in self._per_layer("nu"):
            _check_at_least_zero(value, "nu")
        if self.skr_gamma is not None:
            for value in self._per_layer("skr_gamma"):
                check_integer(value, "skr_gamma", minimum=1)

    def _per_layer(self, name: str) -> tuple:
        """The values of a setting given once or once per Gram layer; an error naming it for a wrong count."""
        value = getattr(self, name)
        if not isinstance(value, (tuple, list)):
            return (value,)
        if len(value) != len(self.layers):
            raise InvalidArgumentError(name, f"needs one value per Gram layer ({len(self.layers)}), got {len(value)}")
        return tuple(value)

    def network_inputs(self, X):
        """Inputs as the network takes them: ``[N, ν₀]`` (fc), ``[N, H, W, C]`` (conv; reshaped
        from ``[N, H·W·C]`` with ``image_shape`` when given flattened)."""
        if self.architecture == "conv" and X.ndim == 2 and self.image_shape is not None:
            H, W = self.image_shape[:2]
            C = self.image_shape[2] if len(self.image_shape) == 3 else 1
            return X.reshape(X.shape[0], H, W, C)
        return X

    def validate_inputs(self, X) -> None:
        """Eager check of flattened inputs ``[N, D]`` against ``image_shape`` (conv), naming ``X``."""
        arr = as_float_array(X, "X", ndim=2)
        if self.architecture == "conv":
            if self.image_shape is None:
                raise InvalidArgumentError("image_shape", "a convolutional DKM fed flattened inputs needs image_shape")
            if arr.shape[1] != math.prod(self.image_shape):
                raise ShapeError("X", f"has {arr.shape[1]} columns; images of shape {tuple(self.image_shape)} "
                                      f"have {math.prod(self.image_shape)}")

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def layer_nu(self, index: int) -> float:
        return float(self.nu[index] if isinstance(self.nu, (tuple, list)) else self.nu)

    def layer_gamma(self, index: int) -> int:
        g = self.skr_gamma
        if g is None:
            return math.ceil(self.layers[index].num_inducing / 4)
        return int(g[index] if isinstance(g, (tuple, list)) else g)

    @property
    def input_inducing(self) -> int:
        return self.num_input_inducing or self.layers[0].num_inducing


def _check_at_least_zero(value, argument: str) -> None:
    if check_real(value, argument) < 0:
        raise InvalidArgumentError(argument, f"must be a finite number >= 0, got {value!r}")


def _flatten_config(config: DKMConfig):
    """A pytree whose only leaves are the likelihood's (its hyperparameters); the architecture is static."""
    static = tuple((f.name, getattr(config, f.name)) for f in dataclasses.fields(config) if f.name != "likelihood")
    return (config.likelihood,), static


def _unflatten_config(static, children) -> DKMConfig:
    return DKMConfig(likelihood=children[0], **dict(static))


jax.tree_util.register_pytree_node(DKMConfig, _flatten_config, _unflatten_config)
