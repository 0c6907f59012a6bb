"""Zoo models of the invariant family (van der Wilk et al. 2018, §4–5, van der Wilk et al. 2017, App. D), registered when :mod:`gpzoo.models.zoo` imports this module.

* ``invariant-finite`` — f(x) = Σ_{g∈G} f_base(g x) for a finite group (default: 90° rotations
  of square images, the swap of x1, x2 for 2-D tables). The whole orbit is exact and fits with
  the ordinary SVGP path; ``num_orbit_samples`` < |G| sub-samples it (App. B.1 estimator).
* ``invariant-rot`` — rotations by φ ~ U(−α, α) with α learned (van der Wilk et al. 2018, §5.1).
* ``invariant-affine`` — affine augmentation, 6 free range pairs (``parameterisation="general"``)
  or rotation/scale/shear/translation ranges (``"interpretable"``) (van der Wilk et al. 2018, §5.2–5.3).
* ``invariant-deform`` — smooth local displacement field + small affine map (van der Wilk et al. 2018, §5.2).

All use inducing points in the base function's input space (``inducing="invariant-points"``)
and, when the kernel is sampled, ``method="invariant-svgp"``. Both are provided by
:mod:`gpzoo.inference.invariant`, which must be imported before ``inference.fit`` (it registers them).
Sampled kernels accept only a Gaussian likelihood or the Pólya–Gamma bound for binary labels
(Bernoulli-logit, the default for ``task="binary"``); multi-class tasks use a Gaussian likelihood
on one output as in van der Wilk et al. 2018, §5.2, only when the user passes one.

Binary tasks with a sampled kernel use the Pólya–Gamma bound; ``pg_c`` picks the tilt of
q(ω_n) = PG(1, c_n): ``"closed-form"`` (c_n = √Ê[f_n²], default), ``"recognition"`` (an MLP of
(x_n, y_n) with hidden widths ``pg_recognition_hidden``, van der Wilk et al. 2018, §4.5) or ``"free"`` (one
learned c_n per training point); see :mod:`gpzoo.inference.invariant`.

Defaults: SE base kernel with lengthscale max(1, √D/2) on images (1 on tables); base variance
1 for augmentation densities (k_f is an average) and 1/|G|² for finite sums (k_f(x, x) then
starts near 1); 8 orbit samples per datum; M = 32 inducing inputs.
"""

from __future__ import annotations

from typing import Annotated, Literal

from gpzoo.models import kernels
from gpzoo.models.errors import InvalidArgumentError
from gpzoo.models.kernels.invariant import (
    AffineAugmentation,
    FiniteOrbit,
    InterpretableAffineAugmentation,
    InvariantKernel,
    LocalDeformation,
    RotationAugmentation,
)
from gpzoo.models.kernels.symmetry import FiniteGroup, ImageSymmetries, SwapInputs
from gpzoo.models.likelihoods import Likelihood
from gpzoo.models.zoo_core import Common, Lengthscale, ModelSpec, register

DEFAULT_ORBIT_SAMPLES = 8
DEFAULT_NUM_INDUCING = 32

OrbitSamples = Annotated[int, "orbit samples per datum in the unbiased kernel estimates"]
Variance = Annotated[float, "variance of the base kernel (k_f is an average over the orbit)"]
PgTilt = Annotated[Literal["closed-form", "recognition", "free"],
                   "tilt c_n of q(ω_n) = PG(1, c_n) for binary tasks: √Ê[f_n²], a recognition MLP, or one free c_n per datum"]
PgHidden = Annotated[tuple[int, ...] | None, "hidden widths of the recognition MLP (pg_c=recognition), e.g. 32,32"]
Ranges = tuple[float, ...] | None


def _base(common: Common, image_shape, lengthscale, variance) -> kernels.Kernel:
    return kernels.SquaredExponential(lengthscale=common.lengthscale(lengthscale, image_shape=image_shape), variance=variance)


def _likelihood(common: Common, sampled: bool) -> Likelihood:
    if sampled and common.likelihood is None and common.task == "multiclass":
        raise InvalidArgumentError(
            "likelihood", "sampled invariant kernels support Gaussian or Bernoulli-logit (Pólya–Gamma) likelihoods; "
            "pass likelihood= explicitly for a multi-class task")
    return common.resolved_likelihood()


def _spec(common: Common, name: str, kernel: InvariantKernel, shape, options, pg_c, pg_recognition_hidden) -> ModelSpec:
    if pg_c != "closed-form" or pg_recognition_hidden is not None:  # checked by inference.invariant
        options = options | {"pg_c": pg_c} | ({} if pg_recognition_hidden is None else {"pg_recognition_hidden": pg_recognition_hidden})
    return common.spec(
        name,
        kernel,
        likelihood=_likelihood(common, kernel.is_sampled),
        inducing="invariant-points",
        method="invariant-svgp" if kernel.is_sampled else "svgp",
        input_kind="image" if shape else "any",
        image_shape=tuple(shape) if shape else None,
        options=options,
    )


@register("invariant-finite", "Invariant GP f(x) = Σ_g f_base(g x) over a finite group; exact or sub-sampled orbit (van der Wilk et al. 2018, eq. 7, App. B.1)",
          num_inducing=DEFAULT_NUM_INDUCING)
def _invariant_finite(common: Common,
                      group: Annotated[FiniteGroup | None, "the finite group G; none: 90° rotations of square images, x1 ↔ x2 on 2-D tables"] = None,
                      num_orbit_samples: Annotated[int | None, "orbit samples per datum; none: the whole orbit (exact)"] = None,
                      lengthscale: Lengthscale = None,
                      variance: Annotated[float | None, "variance of the base kernel; none: 1/|G|²"] = None,
                      pg_c: PgTilt = "closed-form", pg_recognition_hidden: PgHidden = None) -> ModelSpec:
    shape = common.given_image_shape()
    if group is None:
        if shape is not None and len(shape) == 2 and shape[0] == shape[1]:
            group = ImageSymmetries(shape, rotations=True, flips=False)
        elif shape is None and common.input_dim == 2:
            group = SwapInputs()
        else:
            raise InvalidArgumentError("group", "no default group for these inputs; pass a FiniteGroup (e.g. ImageSymmetries, CyclicShift)")
    orbit = FiniteOrbit(group, num_samples=num_orbit_samples)
    variance = 1.0 / group.order**2 if variance is None else variance
    kernel = InvariantKernel(_base(common, shape, lengthscale, variance), orbit)
    return _spec(common, "invariant-finite", kernel, shape, {"group": repr(group), "num_orbit_samples": num_orbit_samples},
                 pg_c, pg_recognition_hidden)


def _augmented(common: Common, name: str, make_orbit, lengthscale, variance, options, pg_c, pg_recognition_hidden) -> ModelSpec:
    """An invariant model over a learned augmentation ``make_orbit(image_shape)`` of grey images."""
    shape = common.required_image_shape("image augmentations need image_shape (H, W)")
    if len(shape) != 2:
        raise InvalidArgumentError("image_shape", f"image augmentations support grey images (H, W), got {shape}")
    kernel = InvariantKernel(_base(common, shape, lengthscale, variance), make_orbit(shape))
    return _spec(common, name, kernel, shape, options, pg_c, pg_recognition_hidden)


@register("invariant-rot", "GP insensitive to rotations φ ~ U(−α, α), α learned by the marginal likelihood (van der Wilk et al. 2018, §5.1)",
          num_inducing=DEFAULT_NUM_INDUCING)
def _invariant_rot(common: Common, max_angle: Annotated[float, "initial α in degrees (learned)"] = 45.0,
                   num_orbit_samples: OrbitSamples = DEFAULT_ORBIT_SAMPLES, lengthscale: Lengthscale = None,
                   variance: Variance = 1.0, pg_c: PgTilt = "closed-form", pg_recognition_hidden: PgHidden = None) -> ModelSpec:
    return _augmented(common, "invariant-rot",
                      lambda shape: RotationAugmentation(shape, max_angle=max_angle, num_samples=num_orbit_samples),
                      lengthscale, variance, {"num_orbit_samples": num_orbit_samples}, pg_c, pg_recognition_hidden)


@register("invariant-affine", "GP insensitive to learned affine augmentations (general 6-parameter or interpretable) (van der Wilk et al. 2018, §5)",
          num_inducing=DEFAULT_NUM_INDUCING)
def _invariant_affine(common: Common,
                      parameterisation: Annotated[Literal["general", "interpretable"],
                                                  "6 free matrix/shift ranges, or rotation/scale/shear/shift ranges"] = "general",
                      lower: Annotated[Ranges, "lower ends of the 6 ranges; none: small ranges around the identity"] = None,
                      upper: Annotated[Ranges, "upper ends of the 6 ranges; none: small ranges around the identity"] = None,
                      num_orbit_samples: OrbitSamples = DEFAULT_ORBIT_SAMPLES, lengthscale: Lengthscale = None, variance: Variance = 1.0,
                      pg_c: PgTilt = "closed-form", pg_recognition_hidden: PgHidden = None) -> ModelSpec:
    if parameterisation == "general":
        # small symmetric ranges around the identity: ±0.05 on the matrix entries, ±1 pixel shift
        lower = (-0.05, -0.05, -0.05, -0.05, -1.0, -1.0) if lower is None else lower
        upper = (0.05, 0.05, 0.05, 0.05, 1.0, 1.0) if upper is None else upper
        augmentation = AffineAugmentation
    elif parameterisation == "interpretable":
        # ±10°, ±5 % scale, ±0.05 shear, ±1 pixel shift
        lower = (-10.0, -0.05, -0.05, -0.05, -1.0, -1.0) if lower is None else lower
        upper = (10.0, 0.05, 0.05, 0.05, 1.0, 1.0) if upper is None else upper
        augmentation = InterpretableAffineAugmentation
    else:
        raise InvalidArgumentError("parameterisation", f"must be 'general' or 'interpretable', got {parameterisation!r}")
    return _augmented(common, "invariant-affine",
                      lambda shape: augmentation(shape, lower=lower, upper=upper, num_samples=num_orbit_samples),
                      lengthscale, variance, {"parameterisation": parameterisation, "num_orbit_samples": num_orbit_samples},
                      pg_c, pg_recognition_hidden)


@register("invariant-deform", "GP insensitive to learned local deformations (smooth displacement field + small affine) (van der Wilk et al. 2018, §5.2)",
          num_inducing=DEFAULT_NUM_INDUCING)
def _invariant_deform(common: Common, displacement: Annotated[float, "initial size of the displacement field, pixels"] = 1.0,
                      max_angle: Annotated[float, "initial rotation range, degrees"] = 10.0,
                      max_log_scale: Annotated[float, "initial log-scale range"] = 0.05,
                      max_shear: Annotated[float, "initial shear range"] = 0.05,
                      smoothness: Annotated[float, "width of the Gaussian smoothing the displacement noise, pixels (fixed)"] = 3.0,
                      num_orbit_samples: OrbitSamples = DEFAULT_ORBIT_SAMPLES, lengthscale: Lengthscale = None,
                      variance: Variance = 1.0, pg_c: PgTilt = "closed-form", pg_recognition_hidden: PgHidden = None) -> ModelSpec:
    return _augmented(common, "invariant-deform",
                      lambda shape: LocalDeformation(shape, displacement=displacement, max_angle=max_angle,
                                                     max_log_scale=max_log_scale, max_shear=max_shear,
                                                     smoothness=smoothness, num_samples=num_orbit_samples),
                      lengthscale, variance, {"num_orbit_samples": num_orbit_samples}, pg_c, pg_recognition_hidden)
