"""`raftlog bench produce --only ACKS.SIZE.pN` runs just the named points (iterating on one
point takes ~20 s instead of the whole ~75 s workload), and the names are the figure ids'."""

from __future__ import annotations

import pytest

from bench.catalogue import MEASURES, PRODUCE_MEASURES
from bench.cli import add_arguments, config_from_args
from bench.workloads import produce


def test_only_picks_the_named_points_in_the_full_sets_order() -> None:
    assert produce.configs(False, ["quorum.1KiB.p8"]) == [("quorum", "1KiB", 8)]
    assert produce.configs(True, ["leader.16KiB.p1", "quorum.1KiB.p8"]) == \
        [("leader", "16KiB", 1), ("quorum", "1KiB", 8)]


def test_without_produce_points_every_point_runs() -> None:
    assert len(produce.configs(False, [])) == 18
    assert len(produce.configs(False, ["fsyncs"])) == 18  # another workload's measure
    assert set(PRODUCE_MEASURES) <= set(MEASURES)


def test_an_unknown_point_is_refused_naming_the_choices() -> None:
    import argparse

    p = argparse.ArgumentParser()
    add_arguments(p)
    with pytest.raises(SystemExit, match="quorum.1KiB.p8"):
        config_from_args(p.parse_args(["produce", "--only", "quorum.1KB.p8"]))
