"""Compares side by side share a report folder's runs (`compare.sharing`): a claimed run is left for later,
then taken once its claim is let go; a dead compare's claims are free."""

import subprocess
import sys
from contextlib import ExitStack

from ggpo_offline.compare.sharing import CLAIMS_FOLDER, claim, take_turns


def test_a_run_held_elsewhere_comes_after_the_others_once_let_go(tmp_path):
    other = ExitStack()  # another compare, holding run b
    assert other.enter_context(claim(tmp_path, "b", wait=False)) is True
    seen = []
    for position, run in take_turns(["a", "b", "c"], tmp_path, str):
        # while a run is handled its claim is held: nobody else can take it
        with claim(tmp_path, run, wait=False) as taken:
            assert taken is False
        seen.append((position, run))
        if run == "c":
            other.close()  # the other compare lets go of b (it has finished it)
    assert seen == [(0, "a"), (2, "c"), (1, "b")]
    with claim(tmp_path, "b", wait=False) as taken:  # and every claim is let go at the end
        assert taken is True
    assert sorted(p.name for p in (tmp_path / CLAIMS_FOLDER).iterdir()) == ["a.lock", "b.lock", "c.lock"]


def test_a_compare_that_dies_lets_go_of_its_claims(tmp_path):
    holds_and_dies = (
        "import fcntl, os, sys; from pathlib import Path; "
        f"folder = Path({str(tmp_path / CLAIMS_FOLDER)!r}); folder.mkdir(parents=True); "
        "handle = open(folder / 'a.lock', 'a'); fcntl.flock(handle, fcntl.LOCK_EX); os._exit(0)"
    )
    subprocess.run([sys.executable, "-c", holds_and_dies], check=True, timeout=60)
    assert [run for _, run in take_turns(["a"], tmp_path, str)] == ["a"]
