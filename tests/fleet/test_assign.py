"""The GPU assignment the fleet placement and the LoRA decision share (pipeline/fleet/assign.py)."""

from __future__ import annotations

import doctest

from pipeline.fleet import assign
from pipeline.fleet.assign import Engine, assign_gpus


def test_docstring_example():
    assert doctest.testmod(assign).failed == 0


def test_given_ids_first_then_largest_on_least_loaded():
    engines = [
        Engine("small", 1, 4.0),
        Engine("pinned", 2, 10.0, (1, 2)),  # the spec's ids are kept, whatever the load
        Engine("big", 2, 20.0),
    ]
    gpus, load = assign_gpus(engines, 3)
    # big goes first (largest): GPU 0 is empty, then GPU 1 and 2 tie at 10, the lower index wins
    assert gpus == {"pinned": (1, 2), "big": (0, 1), "small": (2,)}
    assert load == [20.0, 30.0, 14.0]


def test_equal_engines_keep_their_order_and_spread():
    gpus, load = assign_gpus([Engine("a", 1, 1.0), Engine("b", 1, 1.0), Engine("c", 1, 1.0)], 2)
    assert gpus == {"a": (0,), "b": (1,), "c": (0,)}
    assert load == [2.0, 1.0]


def test_ids_outside_the_server_add_no_load():
    # the placement refuses such ids with the spec's line; the decision only needs the load
    gpus, load = assign_gpus([Engine("odd", 1, 5.0, (7,))], 2)
    assert gpus == {"odd": (7,)} and load == [0.0, 0.0]
