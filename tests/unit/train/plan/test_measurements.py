"""The benchmarks' records: written with their time and as the latest of their kind, read back."""

from __future__ import annotations

import json

from train.plan import measurements


def test_report_json_is_written_twice_and_read_back(tmp_path, monkeypatch):
    monkeypatch.setattr(measurements, "REPORT_DIR", tmp_path / "bench")
    path = measurements.write({"benchmark": "bench-net", "link_mbps": 95.6}, "net")
    assert path.parent == tmp_path / "bench" and path.name.startswith("net-2")
    assert json.loads(path.read_text())["link_mbps"] == 95.6
    assert measurements.latest("net") == {"benchmark": "bench-net", "link_mbps": 95.6}
    assert measurements.latest("step") is None
