"""Data-parallel training: one model's minibatch split across JAX devices.

``fit(..., devices=...)`` builds a one-axis :class:`jax.sharding.Mesh` (axis ``"data"``) over the
devices. The parameters, the optimiser state and the arrays every step reads are *replicated*
(``PartitionSpec()``). Each step (:meth:`DataParallel.svi_update`) is ``jax.shard_map`` of the
loss over the minibatch rows: device s receives its B / n rows and differentiates the minibatch
ELBO *of those rows*, whose data term NumPyro's plate scales by N / (B / n); the values and
gradients are averaged across the mesh with one ``pmean`` (one all-reduce), and the optimiser
update then runs replicated, the same on every device. For a data term that is a sum over data
points (van der Wilk et al. 2017, eq. 5) the average is exactly the single-device minibatch ELBO,

    (1/n) Σ_s [ N/(B/n) Σ_{i∈s} E_q[log p(y_i | f_i)] − KL ]  =  N/B Σ_i E_q[log p(y_i | f_i)] − KL,

with the KL (and any other term that does not read the rows, such as sampled hyperparameters)
counted once: every device computes it from the same replicated parameters and key. The ELBO,
its gradient and hence the fit equal the single-device values up to the order of floating-point
summation. The SPMD partitioner never sees the global batch, so nothing computed from the rows
(the conv model's ``[B, 1, P, E]`` patches, Kuf) is all-gathered: the compiled step has one
all-reduce (``benchmarks/data_parallel_step.py``).

A family whose data term draws random numbers *for every data point* (:func:`per_point_draws`:
the softmax likelihood's Monte Carlo expectation, the deep GP's sampled hidden layers) keeps the
older step, :meth:`DataParallel.shard_rows`: a sharding constraint on the rows inside the
single-device program, with the all-reduce (and all-gathers) the partitioner inserts. Inside
``shard_map`` each device would draw its rows' numbers from the same key with its shard's shape,
which are not the numbers the single-device step draws for those rows: an equally valid estimate,
but not the single-device ELBO. Under the sharding constraint the draws are made for the global
batch (JAX's partitionable threefry gives the same numbers whatever the sharding), so the step
equals the single-device one there too.

Several hosts: start every process with :func:`jax.distributed.initialize` before anything else
touches JAX, then call ``fit`` in every process with the same data, settings and
``devices=jax.devices()`` (the global device list); each process feeds its local devices.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from numpyro.infer.svi import SVIState

from gpzoo.models.errors import InvalidArgumentError

__all__ = ["DATA_AXIS", "DataParallel", "per_point_draws", "resolve_devices"]

#: Name of the mesh axis the minibatch rows are split along.
DATA_AXIS = "data"


def resolve_devices(devices) -> tuple | None:
    """``devices`` as a tuple of distinct JAX devices: None stays None (one device, no mesh), an int n
    is the first n of ``jax.devices()``; anything else is an ``InvalidArgumentError`` naming ``devices``."""
    if devices is None:
        return None
    available = jax.devices()
    if isinstance(devices, (int, np.integer)) and not isinstance(devices, bool):
        if not 1 <= int(devices) <= len(available):
            raise InvalidArgumentError("devices", f"asks for {int(devices)} devices but {len(available)} are available "
                                                  f"({available[0].platform}); give 1 to {len(available)}, a list of "
                                                  "devices, or None")
        return tuple(available[: int(devices)])
    if isinstance(devices, (str, bytes)) or not isinstance(devices, Sequence):
        raise InvalidArgumentError("devices", f"expected a device count, a sequence of JAX devices or None, got {devices!r}")
    devices = tuple(devices)
    if not devices:
        raise InvalidArgumentError("devices", "is empty; give at least one device (or None)")
    if not all(isinstance(d, jax.Device) for d in devices):
        raise InvalidArgumentError("devices", f"expected JAX devices (jax.devices()), got {devices!r}")
    if len(set(devices)) != len(devices):
        raise InvalidArgumentError("devices", f"lists a device twice: {devices}")
    return devices


def per_point_draws(family) -> bool:
    """True when ``family``'s data term draws random numbers for each data point, so that its
    minibatch ELBO is not the average of its shards' ELBOs draw for draw (module docstring).

    A family says so with a ``per_point_draws`` attribute; without one, a Monte Carlo data term
    (``family.stochastic_expectation``) is taken to draw per point, and a family that declares
    neither is too."""
    return bool(getattr(family, "per_point_draws", getattr(family, "stochastic_expectation", True)))


@dataclasses.dataclass(frozen=True)
class DataParallel:
    """A one-axis device mesh: :meth:`replicate` places a pytree on every device, :meth:`svi_update`
    is one data-parallel SVI step, :meth:`value_and_grad` its loss and gradient, and :meth:`shard_rows`
    (inside a compiled function) splits an array's leading axis across the devices."""

    devices: tuple

    @property
    def mesh(self) -> Mesh:
        return Mesh(np.asarray(self.devices, dtype=object), (DATA_AXIS,))

    @property
    def size(self) -> int:
        return len(self.devices)

    def check_batch_size(self, batch_size: int) -> None:
        """The minibatch must split evenly: ``InvalidArgumentError`` naming ``batch_size`` otherwise."""
        if batch_size % self.size:
            raise InvalidArgumentError("batch_size", f"{batch_size} rows do not split evenly across {self.size} devices; "
                                                     f"give a multiple of {self.size}")

    @property
    def rows_sharding(self) -> NamedSharding:
        """Leading axis split across the mesh (``PartitionSpec("data")``)."""
        return NamedSharding(self.mesh, PartitionSpec(DATA_AXIS))

    def replicate(self, tree):
        """``tree`` with every array on every device of the mesh."""
        return jax.device_put(tree, NamedSharding(self.mesh, PartitionSpec()))

    def value_and_grad(self, loss):
        """``jax.value_and_grad(loss)`` of ``loss(params, *rows, **row_kwargs)`` computed data-parallel with
        ``jax.shard_map``: every device differentiates ``loss`` on its own B / n rows of each array in ``rows``
        and ``row_kwargs`` (``params`` replicated), and the values and gradients are averaged across the mesh
        (one ``pmean``: a single all-reduce of the value and every gradient leaf together).

        Exact for a loss whose value on B rows is the average of its values on n equal shards of them, such
        as the minibatch ELBO ``KL − N / b · Σ_{i ≤ b} E_q[log p(y_i | f_i)]`` on b rows (module docstring).
        The SPMD partitioner never sees the global batch, so nothing computed from the rows is all-gathered."""
        value_and_grad = jax.value_and_grad(loss)

        def local(params, rows, row_kwargs):
            return jax.lax.pmean(value_and_grad(params, *rows, **row_kwargs), DATA_AXIS)

        def split(params, *rows, **row_kwargs):
            specs = (PartitionSpec(), PartitionSpec(DATA_AXIS), PartitionSpec(DATA_AXIS))
            return jax.shard_map(local, mesh=self.mesh, in_specs=specs, out_specs=PartitionSpec(),
                                 check_vma=False)(params, rows, row_kwargs)

        return split

    @staticmethod
    def check_no_mutable_state(state: SVIState) -> None:
        """A model with NumPyro mutable state (e.g. a batch statistic updated each step) cannot take the
        split step, whose shards would each update their own copy: ``InvalidArgumentError`` naming
        ``devices``. Call it on the initial state, before the step is traced."""
        if jax.tree_util.tree_leaves(state.mutable_state):
            raise InvalidArgumentError("devices", "cannot split a model with NumPyro mutable state across devices; "
                                                  "fit it on one device (devices=None)")

    def svi_update(self, svi, state: SVIState, *rows, static_kwargs: dict | None = None, **row_kwargs):
        """One data-parallel step of NumPyro's ``svi.update(state, *rows, **static_kwargs, **row_kwargs)``;
        returns ``(state, loss)`` as it does.

        ``rows`` and ``row_kwargs`` are arrays whose leading axis runs over the minibatch rows (X, y, the
        rows' training-set indices): they are split across the mesh. ``static_kwargs`` (``num_data``) reach
        every shard as they are. The loss and gradient come from :meth:`value_and_grad` with the step's key
        split from ``state.rng_key`` exactly as ``SVI.update`` does; the optimiser update is applied to the
        replicated state. The family's ELBO must have no mutable state (gpzoo's ``FastELBO`` has none)."""
        self.check_no_mutable_state(state)
        rng_key, rng_step = jax.random.split(state.rng_key)
        static = {**(static_kwargs or {}), **svi.static_kwargs}

        def loss(params, *rows, **row_kwargs):
            return svi.loss.loss(rng_step, svi.constrain_fn(params), svi.model, svi.guide, *rows, **row_kwargs, **static)

        value, grads = self.value_and_grad(loss)(svi.optim.get_params(state.optim_state), *rows, **row_kwargs)
        return SVIState(svi.optim.update(grads, state.optim_state, value=value), state.mutable_state, rng_key), value

    def shard_rows(self, *arrays):
        """The arrays with their leading axis split across the mesh (a sharding constraint, for use under jit).

        The step of the families with :func:`per_point_draws`: the program stays the single-device one, and
        the SPMD partitioner splits the per-point work and inserts the collectives."""
        out = tuple(jax.lax.with_sharding_constraint(a, self.rows_sharding) for a in arrays)
        return out if len(out) != 1 else out[0]
