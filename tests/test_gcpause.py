"""The collector pause restores the collector's state, also when nested or on error."""

from __future__ import annotations

import gc

import pytest

from flowc.check import check_source
from flowc.gcpause import gc_paused


def test_pause_restores_state_when_nested_and_on_error():
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(ValueError), gc_paused():
        raise ValueError
    assert gc.isenabled()


def test_checking_leaves_the_collector_on():
    check_source("role {", "t.flow")
    check_source("placeholder p: Json\n", "t.flow")
    assert gc.isenabled()


def test_a_disabled_collector_stays_disabled():
    gc.disable()
    try:
        check_source("placeholder p: Json\n", "t.flow")
        assert not gc.isenabled()
    finally:
        gc.enable()
