"""Weight sync from the trainer ranks to the rollout engines, naming no transport.

Every trainer rank publishes (a sharded trainer gathers each weight across ranks; rank 0
quantizes and sends), every engine applies the whole update or refuses it, and all engines must
end at the same new policy version — otherwise the run fails with the versions each reported.
"""

from __future__ import annotations

from typing import Any

import ray


class WeightSyncError(RuntimeError):
    """Engines disagree on the policy version after a sync; the run must not continue."""


def sync_weights(
    trainers: list[Any],
    engines: list[Any],
    *,
    reference: list[Any] | None = None,
    transport: str = "object_store",
) -> int:
    """Publish the trainer's weights, apply them on every engine (and ``reference`` actors, the
    version-0 initial policy); return the new policy version.

    The payload goes through the transport set up at launch; the driver only forwards the
    manifest and the handle (an object ref), never the tensors. Over NCCL the engines enter the
    broadcast while rank 0 sends.

    Raises:
        WeightSyncError: the engines report different versions (each engine's is named).
    """
    published = [t.publish.options(num_returns=2).remote() for t in trainers]
    update_ref, payload_ref = published[0]
    sending = []
    if transport == "nccl":  # receivers need the manifest before rank 0 broadcasts
        update_ref = ray.get(update_ref)
        sending = [trainers[0].broadcast.remote()]
    applied = [e.apply_weights.remote(update_ref, payload_ref) for e in engines]
    reference_applied = []
    if reference:
        ref_published = [
            t.publish.options(num_returns=2).remote(role="reference") for t in trainers
        ]
        ref_update, ref_payload = ref_published[0]
        reference_applied = [r.apply_weights.remote(ref_update, ref_payload) for r in reference]
        ray.get([ref for pair in ref_published[1:] for ref in pair])
    versions = ray.get(applied)
    ray.get(reference_applied)
    ray.get(sending)
    ray.get([ref for pair in published[1:] for ref in pair])  # other ranks' share of the gathers
    return check_versions(versions)


def check_versions(versions: list[int]) -> int:
    """The common version of all engines.

    Raises:
        WeightSyncError: they differ (the message lists engine → version).
    """
    if len(set(versions)) > 1:
        listed = ", ".join(f"rollout[{i}]={v}" for i, v in enumerate(versions))
        raise WeightSyncError(f"engines hold different policy versions after a sync: {listed}")
    return versions[0]
