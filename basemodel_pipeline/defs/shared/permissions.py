"""Whether the steps' user may write the workspace: checked before a step starts (launcher.py), so that a
volume owned by another uid fails with one line naming the directory instead of a PermissionError deep in
a container."""

from __future__ import annotations

import os
import stat
from pathlib import Path


def _can_write(st: os.stat_result, uid: int, gid: int) -> bool:
    """Whether uid:gid may create files in a directory with this stat (supplementary groups not known)."""
    mode = st.st_mode
    if st.st_uid == uid:
        return bool(mode & stat.S_IWUSR and mode & stat.S_IXUSR)
    if st.st_gid == gid:
        return bool(mode & stat.S_IWGRP and mode & stat.S_IXGRP)
    return bool(mode & stat.S_IWOTH and mode & stat.S_IXOTH)


# The workspace directories steps write into (basemodel_pipeline.workspace); others (the data, dagster_home)
# may belong to anyone.
WRITTEN_DIRS = (
    "extracts",
    "cache",
    "staging",
    "checkpoints",
    "predictions",
    "embeddings",
    "state",
    "explanations",
    "reports",
)


def unwritable_dir(root: Path, uid: int, gid: int) -> Path | None:
    """The workspace directory, or the first of the directories steps write into (and their children), that
    uid:gid cannot write; None when it can write them all."""
    candidates = [root]
    for name in WRITTEN_DIRS:
        child = root / name
        if child.is_dir() and not child.is_symlink():
            candidates.append(child)
            candidates.extend(sorted(g for g in child.iterdir() if g.is_dir() and not g.is_symlink()))
    for directory in candidates:
        if not _can_write(directory.stat(), uid, gid):
            return directory
    return None
