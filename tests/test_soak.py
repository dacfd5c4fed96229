"""The soak test's script (tests/soak.py), for seconds instead of minutes: tuners and readers on one cache while a
tuner is SIGKILLed (and PostgreSQL restarted and frozen); nothing lost, tuned twice or computed wrong, no lookup
failed outside the faults."""

import os

import pytest

import soak


def _short(store: str, **extra):
    args = soak.parse(["--store", store, "--tuners", "3", "--readers", "5", "--minutes", "0.33", "--layers", "120",
                       "--delay", "0.1", "--interval", "0.05", "--check-share", "0.5", "--kill-every", "5", "--freeze", "2"])
    for key, value in extra.items():
        setattr(args, key, value)
    return soak.run(args)


def _check(report):
    assert report["ok"], soak.summary(report)
    assert report["plans_lost"] == report["duplicate_tunings"] == report["wrong_results"] == 0
    assert report["tuned"] > 0 and report["results_checked"] > 0 and report["tuners_killed"] >= 2
    # (a tuner SIGKILLed between storing its plan and saying so leaves a plan stored and not counted as tuned)
    assert report["tuned"] <= report["plans_stored"] <= report["tuned"] + report["tuners_killed"]


def test_soak_on_sqlite_loses_nothing_and_tunes_nothing_twice():
    _check(_short("sqlite"))


@pytest.mark.postgres
def test_soak_on_postgres_through_restarts_and_a_freeze():
    from pgserver import find_bin
    if not (find_bin("initdb") and find_bin("pg_ctl")):
        if os.environ.get("CI"):
            pytest.fail("PostgreSQL tests must run in CI: no initdb/pg_ctl")
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) not found")
    report = _short("postgresql")
    _check(report)
    assert [f["kind"] for f in report["faults"]] == ["restart", "freeze", "restart"]
    assert all("error" not in f for f in report["faults"])
