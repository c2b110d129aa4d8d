"""The five retention settings: flags and TOML keys in, a validated policy out, errors that say
what to fix."""

from __future__ import annotations

import argparse

import pytest

from raft.core.retention import RetentionPolicy

from raft.node.config import ConfigError, NodeConfig, parse_duration_ms, parse_size

PEERS = "1=127.0.0.1:7101"


def config(**values: object) -> NodeConfig:
    return NodeConfig.from_dict({"node_id": 1, "data_dir": "d", "peers": PEERS, **values})


def test_defaults_keep_everything() -> None:
    policy = config().retention_policy()
    assert not policy.active
    assert (policy.max_bytes, policy.max_age_ms, policy.min_age_ms, policy.valve_age_ms,
            policy.low_disk_bytes) == (None, None, 0, None, 0)


@pytest.mark.parametrize("text, want", [("64MiB", 64 << 20), ("1GiB", 1 << 30),
                                        ("10GB", 10 * 1000**3), ("4096", 4096),
                                        ("2 kib", 2048)])
def test_sizes(text: str, want: int) -> None:
    assert parse_size(text) == want


@pytest.mark.parametrize("text, want", [("7d", 7 * 86_400_000), ("12h", 43_200_000),
                                        ("30m", 1_800_000), ("45s", 45_000), ("250", 250),
                                        ("250ms", 250)])
def test_durations(text: str, want: int) -> None:
    assert parse_duration_ms(text) == want


def test_flags_and_toml_give_the_same_policy(tmp_path) -> None:
    parser = argparse.ArgumentParser()
    NodeConfig.add_arguments(parser)
    args = parser.parse_args(["--node-id", "1", "--data-dir", "d", "--peers", PEERS,
                              "--retention-bytes", "64MiB", "--retention-ms", "7d",
                              "--retention-min-ms", "10m", "--retention-max-ms", "1d",
                              "--low-disk-mb", "2048"])
    from_flags = NodeConfig.from_args(args).retention_policy()
    toml = tmp_path / "node.toml"
    toml.write_text(f'node_id = 1\ndata_dir = "d"\npeers = "{PEERS}"\n'
                    'retention_bytes = "64MiB"\nretention_ms = 604800000\n'
                    'retention_min_ms = "10m"\nretention_max_ms = "1d"\nlow_disk_mb = 2048\n')
    from_toml = NodeConfig.from_toml(toml).retention_policy()
    assert from_flags == from_toml
    assert (from_flags.max_bytes, from_flags.max_age_ms, from_flags.min_age_ms,
            from_flags.valve_age_ms, from_flags.low_disk_bytes) == (
        64 << 20, 7 * 86_400_000, 600_000, 86_400_000, 2048 << 20)


@pytest.mark.parametrize("values, fragment", [
    ({"retention_bytes": "lots"}, "retention_bytes 'lots' must be a whole number"),
    ({"retention_bytes": 0}, "retention_bytes must be >= 1"),
    ({"retention_ms": "3 fortnights"}, "retention_ms '3 fortnights'"),
    ({"retention_min_ms": -1}, "retention_min_ms must be >= 0"),
    ({"low_disk_mb": -5}, "low_disk_mb must be >= 0"),
    ({"retention_bytes": 1 << 20, "retention_min_ms": 60_000, "retention_max_ms": 1000},
     "retention_max_ms (1000) must be above retention_min_ms (60000)"),
])
def test_bad_settings_say_what_to_fix(values: dict, fragment: str) -> None:
    with pytest.raises(ConfigError) as e:
        config(**values)
    assert fragment in str(e.value)


@pytest.mark.parametrize("policy,wait_s", [
    (RetentionPolicy(max_bytes=1 << 20), None),  # size alone: only an input can change it
    (RetentionPolicy(max_bytes=1 << 20, low_disk_bytes=1 << 20), 30.0),
    (RetentionPolicy(max_age_ms=7 * 86_400_000), 30.0),  # a week: checked twice a minute
    (RetentionPolicy(max_bytes=1, valve_age_ms=3000), 0.25),  # short ages: as often as ever
    (RetentionPolicy(max_age_ms=100_000), 5.0),
])
def test_a_quiet_group_waits_for_what_can_change_its_retention(policy, wait_s) -> None:
    """A quiesced partition runs no retention round until an input, a settings change or,
    when an age or the low-disk valve is set, a bounded pause: 1,000 idle partitions under a
    size limit must not make four rounds a second each (raft/node/retention.py)."""
    from raft.node.retention import RetentionTask
    task = RetentionTask(object(), policy)
    assert task._quiet_wait_s() == wait_s


def test_a_flush_far_past_the_size_limit_starts_the_next_round_now() -> None:
    """Retention runs a round every RETENTION_INTERVAL_S, and a flush that leaves the log past
    its size limit by the overshoot (and that much written since the last round) ends the
    pause at once: otherwise a fast writer puts interval x rate bytes past the limit and the
    data file grows by as much (a GiB at ~200 MB/s through 64 MiB peaked at 127-135 MiB). Not
    while a hold stopped the last round, and at most once per overshoot written, so a log
    retention cannot cut never spins it."""
    from types import SimpleNamespace

    import trio
    import trio.testing

    from raft.node.retention import OVERSHOOT_MIN_BYTES, RetentionTask

    limit = 64 << 20
    log = SimpleNamespace(retained_bytes=0)
    task = RetentionTask(SimpleNamespace(log=log, quiet=False), RetentionPolicy(max_bytes=limit))
    over = limit + OVERSHOOT_MIN_BYTES
    for retained, held, since, wakes in [
        (limit + 1, False, 0, False),  # past the limit, within the overshoot: the timer's
        (over + 1, False, 0, True),
        (over + 1, True, 0, False),  # a hold stopped the last round: the timer's
        (over + 1, False, over + 1 - OVERSHOOT_MIN_BYTES // 2, False),  # too little written
    ]:
        log.retained_bytes = retained
        task._last = {"held_by": "member 2" if held else None}
        task._bytes_after_round, task._wake = since, trio.Event()
        task.on_flushed()
        assert task._wake.is_set() == wakes, (retained, held, since)

    async def pause_ends_at_once() -> float:
        task._wake = trio.Event()
        task._last, task._bytes_after_round, log.retained_bytes = {}, 0, over + 1
        task.on_flushed()
        await task._pause(0)
        return trio.current_time()

    assert trio.run(pause_ends_at_once, clock=trio.testing.MockClock(autojump_threshold=0)) == 0
    assert RetentionTask(SimpleNamespace(log=log), RetentionPolicy()).on_flushed() is None
