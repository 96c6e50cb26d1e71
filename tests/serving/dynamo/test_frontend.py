from dataclasses import replace

import pytest

from serving.config import ServingConfig
from serving.dynamo.frontend import router_args
from serving.errors import ServingError

KV = ServingConfig(mode="kv_routed")


def test_the_default_frontend_asks_dynamo_for_soft_sessions():
    """What the project controls is the frontend's arguments: soft affinity that yields above
    85% of the decode blocks. That the router then moves a session off a busy engine is
    Dynamo's behaviour, measured with busy engines by scripts/bench_kvtier.py."""
    args = router_args(KV)
    assert args[:2] == ["--router-mode", "kv"]
    assert args[args.index("--router-session-affinity-mode") + 1] == "soft"
    assert args[args.index("--router-session-affinity-ttl-secs") + 1] == "600"
    assert args[args.index("--active-decode-blocks-threshold") + 1] == "0.85"
    assert "--router-replica-sync" not in args


def test_hard_sessions_always_pin_and_round_robin_has_no_sessions():
    hard = router_args(replace(KV, session_affinity="hard"))
    assert "hard" in hard and "--active-decode-blocks-threshold" not in hard
    assert router_args(replace(KV, router_mode="round-robin")) == ["--router-mode", "round-robin"]
    assert "--router-session-affinity-mode" not in router_args(replace(KV, session_affinity="off"))


def test_several_frontends_are_asked_to_sync_their_bindings():
    assert "--router-replica-sync" in router_args(replace(KV, frontends=2))


@pytest.mark.parametrize(("key", "value"), [("router_mode", "sticky"),
                                            ("session_affinity", "always")])
def test_unknown_policy_names_the_key(key, value):
    with pytest.raises(ServingError, match=f"serving.{key}"):
        router_args(replace(KV, **{key: value}))
