"""The LATEST pointers: loading a checkpoint stays inside its checkpoint root."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from basemodel_pipeline import files as fs
from basemodel_pipeline import workspace as ws
from basemodel_pipeline.cli import app
from basemodel_pipeline.config import load_config
from basemodel_pipeline.errors import UserError
from basemodel_pipeline.pipeline import run_cache, run_extract

VERSION = "20240301T120000123456Z"


def _roots(tmp_path: Path) -> tuple[Path, Path]:
    """(a checkpoint root with one published version, a directory outside it that looks like a version)."""
    root = tmp_path / "workspace" / "checkpoints" / "foundation"
    (root / VERSION).mkdir(parents=True)
    (root / ".resume").mkdir()
    outside = tmp_path / "elsewhere" / VERSION
    outside.mkdir(parents=True)
    (outside / "model.json").write_text("{}")
    return root, outside


def test_latest_names_a_version_beside_it(tmp_path: Path) -> None:
    root, _ = _roots(tmp_path)
    fs.set_latest(root, VERSION)
    assert fs.latest(root, "foundation checkpoint") == root / VERSION


@pytest.mark.parametrize(
    "pointer",
    [
        "../../../elsewhere/" + VERSION,  # a relative path leaving the root
        "ABSOLUTE",  # an absolute path
        "..",
        ".",
        "",
        ".resume",  # a hidden directory beside LATEST (training state, staging)
        f"{VERSION}/../{VERSION}",
        "not-a-version",
    ],
)
def test_latest_naming_anything_but_a_plain_version_is_a_user_error(tmp_path: Path, pointer: str) -> None:
    root, outside = _roots(tmp_path)
    (root / "not-a-version").mkdir()
    (root / "LATEST").write_text((str(outside) if pointer == "ABSOLUTE" else pointer) + "\n")
    with pytest.raises(UserError) as info:
        fs.latest(root, "foundation checkpoint")
    message = str(info.value)
    assert "\n" not in message
    assert str(root / "LATEST") in message and "version" in message, message
    assert VERSION in message  # what to write into it instead


def test_latest_version_that_is_a_link_out_of_the_root_is_a_user_error(tmp_path: Path) -> None:
    root, outside = _roots(tmp_path)
    linked = "20240302T120000123456Z"
    (root / linked).symlink_to(outside, target_is_directory=True)
    fs.set_latest(root, linked)
    with pytest.raises(UserError, match="outside") as info:
        fs.latest(root, "foundation checkpoint")
    assert f"newest: {VERSION}" in str(info.value)  # the link is not offered as the fix


def test_cli_finetune_with_a_latest_pointing_outside_is_one_line(tiny_config: Path) -> None:
    cfg = load_config(tiny_config)
    run_extract(cfg)
    run_cache(cfg)
    root = ws.foundation_root(cfg)
    (root / VERSION).mkdir(parents=True)
    (root / "LATEST").write_text(str(Path(cfg.workspace).parent) + "\n")  # the directory of the config
    result = CliRunner().invoke(app, ["finetune", str(tiny_config), "-s", "churn"])
    assert result.exit_code == 2, (result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert str(root / "LATEST") in lines[0] and VERSION in lines[0], lines[0]


def test_cleaning_a_symlinked_directory_removes_only_temporaries_a_pipeline_process_claimed(
    tmp_path: Path,
) -> None:
    """cache/ or checkpoints/ may be a symlink to another volume that holds the user's own hidden files ending
    in .tmp: the cleaner removes a temporary only when its owner file says a pipeline process claimed it and
    that process is gone, never a file that merely has the name."""
    import subprocess
    import sys

    volume = tmp_path / "other_volume"
    volume.mkdir()
    (volume / ".notes.tmp").write_text("the user's own")
    (volume / ".backup.tmp").mkdir()
    (volume / ".backup.tmp" / "a.parquet").write_text("the user's own")
    parent = tmp_path / "workspace" / "cache"
    parent.parent.mkdir()
    parent.symlink_to(volume, target_is_directory=True)
    claim = "import sys; from pathlib import Path; from basemodel_pipeline import files as fs; "
    claim += "t = fs.claim_tmp(Path(sys.argv[1]) / 'v1'); t.mkdir(); print(t)"
    dead = Path(subprocess.run([sys.executable, "-c", claim, str(parent)], capture_output=True, text=True,
                               check=True).stdout.strip())  # fmt: skip
    assert dead.exists()  # a pipeline process claimed it and died without cleaning up
    alive = fs.claim_tmp(parent / "v2")
    alive.mkdir()
    try:
        fs.clean_stale_tmp(parent)
        assert not dead.exists() and not Path(str(dead) + fs.OWNER_SUFFIX).exists()
        assert alive.exists()  # this process's own, still being written
        assert (volume / ".notes.tmp").read_text() == "the user's own"
        assert (volume / ".backup.tmp" / "a.parquet").read_text() == "the user's own"
    finally:
        fs.discard_dir(alive)


def test_a_lock_file_that_is_a_directory_is_one_line_naming_it(tiny_config: Path) -> None:
    lock = tiny_config.parent / "extracts" / "transactions" / ".extract.lock"
    lock.mkdir(parents=True)
    result = CliRunner().invoke(app, ["extract", str(tiny_config)])
    assert result.exit_code == 2, result.output
    assert f"{lock} is a directory, not the lock file it should be" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_a_directory_given_as_the_config_says_so(tiny_config: Path) -> None:
    result = CliRunner().invoke(app, ["validate", str(tiny_config.parent)])
    assert result.exit_code == 2
    assert (
        f"{tiny_config.parent} is a directory: pass the path of the YAML config file in it" in result.stderr
    )
    assert "config.yaml" in result.stderr  # the config files it holds, to copy
