"""What the recorded runs' tests share: their log times read as on the machine that recorded them."""

from __future__ import annotations

import time

import pytest


@pytest.fixture
def utc(monkeypatch):
    """The recordings' log times are UTC, read as local time: as on the machine that recorded them
    (a test module asks for it with `pytestmark = pytest.mark.usefixtures("utc")`)."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()
