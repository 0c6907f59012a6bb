"""Data-parallel training: one model's minibatch split across JAX devices with ``jax.sharding``.

``fit(..., devices=...)`` builds a one-axis :class:`jax.sharding.Mesh` (axis ``"data"``) over the
devices. The parameters, the optimiser state and the arrays every step reads are *replicated*
(``PartitionSpec()``); each step's minibatch is *sharded* along its rows
(``PartitionSpec("data")``) by a sharding constraint inside the compiled step, so every device
computes the per-point part of the ELBO (Kuf, the Kff diagonal, the expected log-likelihood) for
its B / n rows, and XLA's SPMD partitioner inserts the all-reduce of the data term's sum and of its
gradient. The KL term and the M×M factorisations are computed on every device (they are small).
:meth:`DataParallel.value_and_grad` is the explicit form: ``jax.shard_map`` of the loss over the
rows and one ``pmean`` of its value and gradient; the partitioner then never sees the global batch,
so nothing computed from the rows is all-gathered (on the conv model the sharding constraint
all-gathers the ``[B, 1, P, E]`` patches and ``[M, B]`` Kuf rows into every step, and the step costs
~1.3× more CPU than the shard_map form; ``benchmarks/data_parallel_step.py``).
This is exact for every family whose data term is a sum over data points (van der Wilk et al.
2017, eq. 5): the ELBO and its gradient equal the single-device values up to the order of
floating-point summation.

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

from gpzoo.models.errors import InvalidArgumentError

__all__ = ["DATA_AXIS", "DataParallel", "resolve_devices"]

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


@dataclasses.dataclass(frozen=True)
class DataParallel:
    """A one-axis device mesh: :meth:`replicate` places a pytree on every device, :meth:`shard_rows`
    (inside a compiled function) splits an array's leading axis across them."""

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
        """``jax.value_and_grad(loss)`` of ``loss(params, *rows)`` computed data-parallel with ``jax.shard_map``:
        every device differentiates ``loss`` on its own B / n rows of each array in ``rows`` (parameters
        replicated) and the values and gradients are averaged across the mesh (one ``pmean``, an all-reduce).

        Exact for a loss that is the average over equal shards of the same loss on each shard, such as the
        minibatch ELBO with its data term scaled by ``num_data / rows`` (``KL - num_data / b * sum``): the mean of
        the shards' losses is the loss on all B rows. Unlike :meth:`shard_rows`, the SPMD partitioner never
        sees the global batch, so nothing computed from the rows (the patches, Kuf) is all-gathered: on the
        conv model the step's program has one all-reduce and no all-gathers."""
        value_and_grad = jax.value_and_grad(loss)

        def local(params, *rows):
            return jax.lax.pmean(value_and_grad(params, *rows), DATA_AXIS)

        def split(params, *rows):
            return jax.shard_map(local, mesh=self.mesh, in_specs=(PartitionSpec(),) + (PartitionSpec(DATA_AXIS),) * len(rows),
                                 out_specs=PartitionSpec(), check_vma=False)(params, *rows)

        return split

    def shard_rows(self, *arrays):
        """The arrays with their leading axis split across the mesh (a sharding constraint, for use under jit)."""
        out = tuple(jax.lax.with_sharding_constraint(a, self.rows_sharding) for a in arrays)
        return out if len(out) != 1 else out[0]
