"""Who may read what: a job's details and a dataset belong to their owner and the admins.

Everyone sees the queue (``GET /v1/jobs``: id, name, owner, status, GPUs, priority, times);
``Settings.team_reads`` opens the rest to the whole team. A resource the caller may not read is
answered as one that does not exist (404), so its existence is not disclosed either.
"""

from __future__ import annotations

from api.auth.service import Principal
from tunebox.settings import Settings


def may_read(user: Principal, owner_id: str, settings: Settings) -> bool:
    """Whether ``user`` may read a job's details or a dataset owned by ``owner_id``."""
    return user.is_admin or owner_id == user.user_id or settings.team_reads


def sees_everything(user: Principal, settings: Settings) -> bool:
    """Whether ``user`` may read every owner's resources (no per-row filter needed)."""
    return user.is_admin or settings.team_reads


def may_use_dataset(user: Principal, owner_id: str, shared: bool, settings: Settings) -> bool:
    """Whether ``user`` may read and train on a dataset: its owner's, the admins', or shared by its owner."""
    return shared or may_read(user, owner_id, settings)
