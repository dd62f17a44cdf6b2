"""The store retry window (``--store-retry-s``) bounds the time one store call takes.

A fake clock drives ``track.store.retry``: each failing attempt advances it by its duration,
each pause by the pause. The bound (docstring of ``retry``): the window counted from the first
attempt, plus the duration of the last attempt (no attempt starts after the window's end).
"""

from __future__ import annotations

import pytest

from parity_tracker.track import store


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.pauses: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.pauses.append(seconds)
        self.now += seconds


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(store.time, "monotonic", fake.monotonic)
    monkeypatch.setattr(store.time, "sleep", fake.sleep)
    return fake


@pytest.mark.parametrize(
    ("window", "attempt_s"), [(1.0, 0.4), (1.0, 0.0), (10.0, 0.7), (0.0, 0.3), (90.0, 2.5)]
)
def test_one_call_takes_at_most_the_window_plus_one_attempt(clock, monkeypatch, window, attempt_s):
    monkeypatch.setenv(store.RETRY_WINDOW_ENV, str(window))
    starts = []

    def refused() -> None:
        starts.append(clock.now)
        clock.now += attempt_s
        raise ConnectionRefusedError("[Errno 111] Connection refused")

    begin = clock.now
    with pytest.raises(ConnectionRefusedError):
        store.retry(refused)
    total = clock.now - begin
    # hand-worked bound: window (from the first attempt) + the last attempt's duration
    assert total <= window + attempt_s + 1e-9
    assert all(s - begin <= window + 1e-9 for s in starts)  # none starts after the end
    assert len(starts) >= 2 or window <= attempt_s  # it did retry when there was time


def test_a_call_that_recovers_inside_the_window_returns_its_value(clock, monkeypatch):
    monkeypatch.setenv(store.RETRY_WINDOW_ENV, "5")
    answers = iter([ConnectionResetError("reset"), ConnectionResetError("reset"), "ok"])

    def flaky() -> str:
        clock.now += 0.2
        got = next(answers)
        if isinstance(got, Exception):
            raise got
        return got

    assert store.retry(flaky) == "ok"


def test_mlflow_http_retries_are_off_unless_the_user_set_them(monkeypatch):
    """MLflow's own retries inside each attempt would stretch one call past the window."""
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)
    store.quiet_mlflow()
    import os

    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "0"
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "3")
    store.quiet_mlflow()
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "3"


@pytest.mark.timeout(60)  # before the fix: MLflow's 7 retries, minutes
def test_a_refused_server_is_given_up_after_about_the_window(monkeypatch):
    """Real clock, real MLflow client, a port nothing listens on, MLflow's retries not set."""
    import time

    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)
    monkeypatch.setenv(store.RETRY_WINDOW_ENV, "0.5")
    uri = "http://127.0.0.1:9"
    monkeypatch.setenv(store.RETRY_WINDOW_ENV, "0")  # a first call: MLflow's imports, untimed
    with pytest.raises(Exception, match=r"(?i)connection"):
        store.get_client(uri)
    monkeypatch.setenv(store.RETRY_WINDOW_ENV, "0.5")
    store._INITIALISED.discard(uri)
    begin = time.monotonic()
    with pytest.raises(Exception, match=r"(?i)connection"):
        store.get_client(uri)
    # 0.5 s window + one refused request (milliseconds); 13.7 s before the fix (MLflow's own
    # retries inside each attempt). Margin for a loaded machine.
    assert time.monotonic() - begin < 0.5 + 2.0
