"""KV-budget admission: n = clamp(k * C / G, group, max), k halved on preemptions."""

from rollout.admission import FixedWindow, KvBudget, session_tokens
from serving import KvState, MetricsError


class Engines:
    """The engines' metrics as the budget reads them; a test sets them turn by turn."""

    def __init__(self, capacity=100_000, preemptions=0.0):
        self.states = [KvState(capacity, 0.5, preemptions)]
        self.down = False

    def __call__(self):
        if self.down:
            raise MetricsError("engine down")
        return self.states


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _record(prompt, completion):
    return {"turns": [{"prompt_tokens": 10, "completion_tokens": 5},
                      {"prompt_tokens": prompt, "completion_tokens": completion}]}


def test_the_limit_is_the_cache_over_a_session_clamped():
    clock = Clock()
    budget = KvBudget(Engines(100_000), group=2, maximum=1000, fill=0.9, guess_tokens=4000,
                      clock=clock)
    assert budget.limit() == int(0.9 * 100_000 / 4000)  # 22
    small = KvBudget(Engines(1000), group=2, maximum=1000, guess_tokens=4000, clock=clock)
    assert small.limit() == 2  # never below one group
    big = KvBudget(Engines(10**9), group=2, maximum=64, guess_tokens=4000, clock=clock)
    assert big.limit() == 64  # never above the maximum


def test_the_cache_is_every_engines_together():
    """Two engines of 60k and 40k tokens: the budget is sized by 100k, not the first's 60k."""
    engines = Engines()
    engines.states = [KvState(60_000, 0.5, 0.0), KvState(40_000, 0.1, 0.0)]
    budget = KvBudget(engines, group=1, maximum=1000, fill=0.9, guess_tokens=4000,
                      clock=Clock())
    assert budget.limit() == int(0.9 * 100_000 / 4000)


def test_finished_sessions_set_the_session_size():
    clock = Clock()
    budget = KvBudget(Engines(100_000), group=1, maximum=1000, fill=1.0, guess_tokens=4000,
                      alpha=0.5, clock=clock)
    assert session_tokens(_record(1900, 100)) == 2000
    budget.observe(_record(1900, 100))  # 4000 -> 3000
    budget.observe(_record(1900, 100))  # 3000 -> 2500
    assert budget.session == 2500 and budget.limit() == 40
    budget.observe({"turns": []})  # an infra error says nothing about sizes
    assert budget.session == 2500


def test_preemptions_halve_the_share_and_calm_restores_it():
    engines, clock = Engines(100_000), Clock()
    budget = KvBudget(engines, group=1, maximum=1000, fill=0.8, guess_tokens=1000,
                      poll_s=2.0, recover_s=30.0, clock=clock)
    assert budget.limit() == 80
    engines.states = [KvState(100_000, 0.99, 3.0)]
    clock.now = 1.0
    assert budget.limit() == 80  # polled at most every 2 s
    clock.now = 2.0
    assert budget.limit() == 40 and budget.k == 0.4
    clock.now = 20.0
    assert budget.limit() == 40  # no preemption, but not calm for 30 s yet
    clock.now = 32.0
    assert budget.limit() == 44  # k * 1.1
    for t in range(34, 400, 32):
        clock.now = float(t)
        budget.limit()
    assert budget.k == 0.8  # back to the ceiling, not beyond


def test_unreadable_metrics_keep_the_last_figures():
    engines, clock = Engines(100_000), Clock()
    budget = KvBudget(engines, group=1, maximum=1000, fill=1.0, guess_tokens=1000, clock=clock)
    assert budget.limit() == 100
    engines.down = True
    clock.now = 5.0
    assert budget.limit() == 100
    fresh = KvBudget(engines, group=3, maximum=1000, clock=clock)
    assert fresh.limit() == 3  # nothing known yet: one group at a time


def test_a_fixed_window_is_fixed():
    window = FixedWindow(8)
    window.observe(_record(10**6, 10**6))
    assert window.limit() == 8


def test_a_session_holds_its_last_prompt_and_that_turn_s_completion():
    record = {"turns": [{"prompt_tokens": 10, "completion_tokens": 5},
                        {"prompt_tokens": 20, "completion_tokens": 6},
                        {"prompt_tokens": 30, "completion_tokens": 7}]}
    assert session_tokens(record) == 37
    assert session_tokens({"turns": []}) == session_tokens({}) == 0


def test_as_the_fleet_builds_it_30_s_without_a_preemption_grow_the_share_by_a_tenth():
    """docs/rollout-engine.md: the defaults the fleet leaves as they are (metrics read every
    2 s, 30 s of calm, each finished session moving the estimate a fifth of the way)."""
    engines, clock = Engines(100_000), Clock()
    budget = KvBudget(engines, group=1, maximum=1000, fill=0.8, guess_tokens=1000, clock=clock)
    assert budget.limit() == 80
    engines.states = [KvState(100_000, 0.99, 1.0)]
    clock.now = 1.9
    assert budget.limit() == 80  # not read again yet
    clock.now = 2.0
    assert budget.limit() == 40
    clock.now = 29.0
    assert budget.limit() == 40  # 27 s of calm
    clock.now = 32.0
    assert budget.limit() == 44
    budget.observe(_record(1500, 500))  # 1000 -> 1200
    assert budget.session == 1200
