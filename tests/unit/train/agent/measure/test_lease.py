"""What a benchmark changed on a host is undone by the host once the controller stops renewing it."""

import os
import threading
import time

from train.agent.measure.lease import hold


def test_a_lease_nobody_renews_is_undone_by_the_host(tmp_path):
    lease, undone = tmp_path / "bench-1", tmp_path / "undone"
    lease.touch()
    os.utime(lease, (time.time() - 5, time.time() - 5))  # the controller's last touch, 5 s ago
    assert hold(lease, ttl_s=2, undo=f"echo stopped > {undone}", every_s=0.05) == "expired"
    assert undone.read_text() == "stopped\n" and not lease.exists()


def test_a_renewed_then_released_lease_undoes_nothing(tmp_path):
    lease, undone = tmp_path / "bench-2", tmp_path / "undone"
    lease.touch()

    def controller():
        for _ in range(6):  # renewed within the ttl, for longer than the ttl
            time.sleep(0.2)
            lease.touch()
        lease.unlink()  # its own clean-up done: released

    worker = threading.Thread(target=controller)
    worker.start()
    assert hold(lease, ttl_s=0.5, undo=f"touch {undone}", every_s=0.05) == "released"
    worker.join()
    assert not undone.exists()
