import time
from types import SimpleNamespace

from serving.dynamo.watchdog import DeregistrationWatchdog, registered


def _worker(name: str, instance_id: str, alive: bool = True):
    return SimpleNamespace(name=name, instance_id=instance_id, alive=lambda: alive,
                           retired=False)


def test_registration_is_read_from_the_discovery_folder(tmp_path):
    folder = tmp_path / "v1" / "instances"
    folder.mkdir(parents=True)
    (folder / "dynamo%2Fbackend%2Fgenerate%2Fabc123").write_text("{}")
    (folder / "dynamo%2Fbackend%2Fclear%5Fkv%5Fblocks%2Fdef456").write_text("{}")
    assert registered(tmp_path, "abc123")
    assert not registered(tmp_path, "def456")  # only its generate endpoint counts
    assert not registered(tmp_path / "nowhere", "abc123")


def test_only_live_unregistered_workers_are_restarted(tmp_path):
    """Not a dead one (the caller's choice), nor one being stopped, which unregisters first
    and may take seconds to exit (a restart by the caller raced the watchdog's)."""
    folder = tmp_path / "v1" / "instances"
    folder.mkdir(parents=True)
    (folder / "dynamo%2Fbackend%2Fgenerate%2Faaa").write_text("{}")
    stopping = _worker("stopping", "ddd")
    stopping.retired = True
    workers = [_worker("kept", "aaa"), _worker("dropped", "bbb"),
               _worker("dead", "ccc", alive=False), stopping]
    restarted = []
    dog = DeregistrationWatchdog(lambda: workers, tmp_path,
                                 lambda name, worker: restarted.append((name, worker)),
                                 interval_s=0.05, grace_s=0.2)
    dog.start()
    time.sleep(0.6)
    dog.stop()
    assert restarted and {name for name, _ in restarted} == {"dropped"}
    assert all(worker is workers[1] for _, worker in restarted)  # the worker it saw
