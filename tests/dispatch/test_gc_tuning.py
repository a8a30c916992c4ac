"""The dispatcher's collector settings (dispatch.gc_tuning), in this process: saved and restored."""

from __future__ import annotations

import gc

import pytest

from dispatch import gc_tuning


@pytest.fixture
def restored_collector():
    threshold = gc.get_threshold()
    yield
    gc.set_threshold(*threshold)
    gc.unfreeze()


def test_the_young_threshold_covers_what_the_configuration_holds_in_flight():
    assert gc_tuning.young_threshold(2000, 1000) == 120_000
    assert gc_tuning.young_threshold(500, 250) == 30_000
    assert gc_tuning.young_threshold(10, 5) == gc_tuning.MIN_YOUNG_THRESHOLD == 20_000


def test_settling_freezes_start_up_and_raises_only_the_young_threshold(restored_collector):
    middle, old = gc.get_threshold()[1:]
    gc_tuning.settle_after_start_up(2000, 1000)
    assert gc.get_threshold() == (120_000, middle, old)
    assert gc.get_freeze_count() > 0
    assert gc.isenabled()


def test_cyclic_garbage_is_still_collected_by_itself(restored_collector):
    """Raised, not disabled: cycles beyond the threshold trigger a collection without gc.collect()."""
    gc_tuning.settle_after_start_up(0, 0)
    before = gc_tuning.collections_so_far()

    class Node:
        pass

    for _ in range(gc_tuning.MIN_YOUNG_THRESHOLD):  # two tracked objects per cycle: twice the threshold
        node = Node()
        node.me = node
    del node
    assert gc_tuning.collections_so_far() > before
