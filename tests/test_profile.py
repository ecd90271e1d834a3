"""A run's profile: phases timed as they run, appended to profile.jsonl, read back and summed by phase."""

import time

import pytest

from ggpo_offline.train.profile import (
    PHASES,
    PhaseTime,
    RunProfile,
    phase_totals,
    seconds_since_process_start,
)
from ggpo_offline.train.run_folder import RunFolder


def test_phases_are_appended_in_order_and_sum_by_phase(tmp_path):
    folder = RunFolder(tmp_path)
    profile = RunProfile()
    with profile.phase("forward_backward", 0):
        time.sleep(0.01)
    with profile.phase("optimizer", 0):
        pass
    folder.append_profile(profile.take())
    assert profile.pending == []
    with profile.phase("forward_backward", 1):
        pass
    folder.append_profile(profile.take())  # a later flush (or a resumed run) appends
    times = folder.read_profile()
    assert [(t.phase, t.update) for t in times] == [
        ("forward_backward", 0), ("optimizer", 0), ("forward_backward", 1),
    ]  # fmt: skip
    assert times[0].seconds >= 0.01
    totals = phase_totals(times)
    assert list(totals) == ["forward_backward", "optimizer"]  # PHASES order
    assert totals["forward_backward"] == (2, times[0].seconds + times[2].seconds)


def test_seconds_a_block_reports_are_phases_of_their_own_carved_out_of_its_time():
    """A round sampled elsewhere reports its sampling, scoring and writing; the block keeps only the rest."""
    profile = RunProfile()
    with profile.phase("round_engine", 4) as parts:
        time.sleep(0.02)
        parts.update({"round_sampling": 0.015, "round_writing": 0.001})
    sampling, writing, rest = profile.take()
    assert sampling == PhaseTime("round_sampling", 4, 0.015)
    assert writing == PhaseTime("round_writing", 4, 0.001)
    assert rest.phase == "round_engine" and rest.update == 4
    assert rest.seconds >= 0.004  # the block's 0.02 s or more, less the 0.016 s carved out
    totals = phase_totals([rest, writing, sampling])
    assert list(totals) == ["round_engine", "round_sampling", "round_writing"]  # PHASES knows them


def test_a_phase_that_raises_is_not_recorded_and_a_missing_file_reads_empty(tmp_path):
    profile = RunProfile()
    with pytest.raises(KeyError), profile.phase("evaluate", 3):
        raise KeyError("engine died")
    assert profile.pending == []
    assert RunFolder(tmp_path / "absent").read_profile() == []


def test_totals_follow_the_phase_list_whatever_the_order_recorded():
    times = [PhaseTime("test", None, 2.0), PhaseTime("process", None, 5.0), PhaseTime("test", None, 1.0)]
    assert phase_totals(times) == {"process": (1, 5.0), "test": (2, 3.0)}
    assert set(phase_totals(times)) <= set(PHASES)


def test_the_process_start_is_counted_once_per_process(monkeypatch):
    monkeypatch.setattr(RunProfile, "_process_counted", False)
    first, second = RunProfile.of_first_run(), RunProfile.of_first_run()
    started = seconds_since_process_start()
    assert started is not None and started > 0  # Linux: read from /proc
    assert [t.phase for t in first.pending] == ["process"] and second.pending == []
    assert 0 < first.pending[0].seconds <= started + 0.01  # /proc counts in hundredths of a second
