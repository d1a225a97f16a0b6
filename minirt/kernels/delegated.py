"""``com.minirt::DelegatedPartition``: the stand-in for a partition built without its CPU version
(``minirt build --no-cpu-fallback``, builder/partition.py ``drop_cpu_versions``).

A session gives the partition to its provider and never runs this node; one that cannot refuses the
artifact at load (Session._delegate_partitions).  The kernel exists so that the node has a CPU entry:
reached anyway (a partition record removed from a file, say), it fails with the same explanation
rather than computing anything.
"""
from __future__ import annotations

from minirt.errors import UnsupportedOperator
from minirt.kernels.registry import kernel
from minirt.vocabulary import DELEGATED_PARTITION, MINIRT_DOMAIN


@kernel(DELEGATED_PARTITION, since=1, domain=MINIRT_DOMAIN)
def delegated_partition(*inputs, provider: str = "", partition: int = -1, nodes: int = 0):
    raise UnsupportedOperator(
        f"partition {partition} ({provider}, {nodes} nodes) was built without its CPU version "
        f"(minirt build --no-cpu-fallback) and only {provider} can run it")
