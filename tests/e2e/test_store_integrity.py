"""The store never trusts what it has not verified, end to end: damaged chunks do not spoil a
job's final checkpoint (it reads back what it reuses and mends it), and a failover whose newest
checkpoint does not verify restores the one before it, saying so."""

import subprocess

import pytest

from tests.conftest import BIN, PY, Cluster, damage_stored, stored_places, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.criu]

LINES = 300
COUNT = [PY, "-c", f"import time\nfor i in range({LINES}):\n    print(i, flush=True)\n    time.sleep(0.05)\n"]


def test_damaged_chunks_do_not_spoil_a_jobs_final_checkpoint(cluster: Cluster) -> None:
    job = cluster.json("run", "--name", "dmg-a", "--node", "node-1", "--", *COUNT)
    cluster.wait_lines("dmg-a", 5)
    first = cluster.json("checkpoint", "dmg-a")
    places = stored_places(cluster.data_dir / "store", job["id"])
    assert places
    for place in places.values():
        damage_stored(place)
    # its final checkpoint reads back every chunk it would reuse, and writes the damaged ones again
    stopped = cluster.json("checkpoint", "dmg-a", "--stop")
    assert stopped["state"] == "committed" and stopped["final"] and stopped["parent"] == first["id"]
    restored = cluster.json("restore", "dmg-a", "--node", "node-2")
    assert restored["state"] == "running" and restored["fallback"] is None
    assert cluster.ferry("wait", "dmg-a", "--timeout", "120", check=False).returncode == 0
    assert cluster.logs("dmg-a").splitlines() == [str(i) for i in range(LINES)]


def test_failover_falls_back_to_the_newest_checkpoint_that_verifies(small_cluster: Cluster) -> None:
    c = small_cluster
    job = c.json("run", "--name", "fb", "--node", "n1", "--", *COUNT)
    c.wait_lines("fb", 10)
    older = c.json("checkpoint", "fb")
    c.wait_lines("fb", 30)
    newest = c.json("checkpoint", "fb")
    manifest = c.data_dir / "store" / "manifests" / job["id"] / f"{newest['id']}.json"
    manifest.write_bytes(manifest.read_bytes()[:100])  # truncated: it no longer verifies
    # events are live only: watch before the crash (the loss is noticed 3 s after it)
    watch = subprocess.Popen([str(BIN / "ferry"), "events", "--job", "fb", "-o", "json"], env=c.env,
                             stdout=subprocess.PIPE, text=True)
    try:
        c.ferry("chaos", "kill-node", "n1")
        moved = wait_until(lambda: (s := c.json("status", "fb"))["node"] == "n2" and s["state"] == "running" and s,
                           90, "the job to run on n2")
    finally:
        watch.terminate()
        events, _ = watch.communicate(timeout=30)
    assert moved["last_checkpoint"] == older["id"]
    assert f"{newest['id']} did not verify" in events and f"restoring the older {older['id']}" in events
    assert c.ferry("wait", "fb", "--timeout", "120", check=False).returncode == 0
    # the steps after the older checkpoint ran again: the output is still that of one whole run
    assert c.logs("fb").splitlines() == [str(i) for i in range(LINES)]
