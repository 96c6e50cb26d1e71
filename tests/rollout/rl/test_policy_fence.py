"""The policy fence: a turn is recorded only if no engine pause fell inside it (each mode's
order of steps, as rollout/rl/policy_update.py runs them)."""

import asyncio

import pytest

from rollout.rl.policy_fence import PolicyBoard, TurnEnd, TurnFence, remote_board


def run(coro):
    return asyncio.run(coro)


def test_a_turn_with_no_pause_inside_is_whole_and_tagged():
    board = PolicyBoard(version=3, checkpoint="abc")

    async def go():
        version = await board.begin("t")
        return version, board.end("t")
    assert run(go()) == ((3, "abc"), TurnEnd(0))


def test_wait_mode_lets_turns_in_flight_finish_on_the_old_weights():
    """wait: no turn begins once the update starts; the turns in flight end before the pause,
    whole, with the old version; a turn begun after the update has the new one."""
    async def go():
        board = PolicyBoard(version=0)
        assert await board.begin("old") == (0, "")
        board.start_update()
        late = asyncio.create_task(board.begin("new"))
        await asyncio.sleep(0.01)
        assert not late.done()  # waits for the update
        assert board.end("old") == TurnEnd(0)  # finished before the engines paused
        assert board.turns_in_flight() == 0
        board.paused()
        board.finish_update(1, "v1")
        assert await late == (1, "v1")
        return board.end("new")
    assert run(go()) == TurnEnd(0)


@pytest.mark.parametrize("mode", ["abort", "keep"])
def test_abort_and_keep_modes_sample_the_turns_in_flight_again(mode):
    """abort / keep: the engines pause at once; a turn in flight then (aborted, or finished
    after the update on two versions) is not whole: the session samples it again."""
    async def go():
        board = PolicyBoard(version=0)
        await board.begin("t")
        board.start_update()
        board.paused()
        assert board.end("t") == TurnEnd(1)  # cut short (abort) or straddling (keep)
        board.finish_update(1, "v1")
        assert await board.begin("t") == (1, "v1")  # the same turn again, on the new weights
        return board.end("t")
    assert run(go()) == TurnEnd(0)


def test_an_update_that_fails_reopens_the_board_on_the_version_served():
    async def go():
        board = PolicyBoard(version=2, checkpoint="v2")
        board.start_update()
        board.finish_update(2, "v2")  # rollout/rl/policy_update.py: what the fleet still serves
        return await asyncio.wait_for(board.begin("t"), 1)
    assert run(go()) == (2, "v2")


def test_a_turn_that_ends_after_an_update_learns_what_that_update_served():
    """A turn one pause fell inside hears the version its update installed once the update is
    over (not before; the version and digest of a failed one's rollback too)."""
    board = PolicyBoard(version=0, checkpoint="v0")

    async def go():
        await board.begin("early")
        await board.begin("late")
        board.start_update()
        board.paused()
        early = board.end("early")  # the update is not over yet
        board.finish_update(1, "v1")
        await board.begin("next")
        board.start_update()
        board.paused()
        board.finish_update(1, "v1")  # failed: the fleet still serves v1
        return early, board.end("late"), board.end("next")
    assert run(go()) == (TurnEnd(1), TurnEnd(2, (1, "v1")), TurnEnd(1, (1, "v1")))


def test_a_turn_the_board_never_saw_begin_ends_with_no_pause_inside():
    board = PolicyBoard()
    assert board.current() == 0  # a board serves version 0 until an update
    board.paused()
    assert board.end("unknown") == TurnEnd(0)


def test_without_a_board_every_turn_is_version_zero_and_whole():
    fence = TurnFence(checkpoint="d0")

    async def go():
        return await fence.begin("t"), await fence.end("t"), await TurnFence().begin("t")
    assert run(go()) == ((0, "d0"), TurnEnd(0), (0, ""))


@pytest.fixture(scope="module")
def one_cpu_ray():
    import ray

    ray.init(address="local", num_cpus=1, include_dashboard=False, logging_level="ERROR")
    yield ray
    ray.shutdown()


def test_the_board_as_a_ray_actor_takes_no_cpu_and_answers_beside_waiting_turns(one_cpu_ray):
    """The board starts on a cluster whose one CPU a session actor holds; with more turns
    waiting for an update than an async actor runs by default (1,000), the update still
    finishes and every waiting turn gets the new version."""
    ray = one_cpu_ray
    session = ray.remote(num_cpus=1)(PolicyBoard).remote()  # holds the cluster's one CPU
    ray.get(session.current.remote(), timeout=60)
    fresh = TurnFence(remote_board(), checkpoint="unused")
    board = remote_board(2, "v2")
    fence = TurnFence(board)

    async def go():
        first = await asyncio.wait_for(fresh.begin("t"), 60)
        assert await asyncio.wait_for(fence.begin("t"), 60) == (2, "v2")
        await board.start_update.remote()
        waiting = [fence.begin(f"w{i}") for i in range(1001)]
        gathered = asyncio.gather(*waiting)
        await asyncio.sleep(1)
        await board.paused.remote()
        await asyncio.wait_for(board.finish_update.remote(3, "v3"), 60)
        versions = set(await asyncio.wait_for(gathered, 120))
        return first, versions, await fence.end("t")
    assert run(go()) == ((0, ""), {(3, "v3")}, TurnEnd(1, (3, "v3")))
