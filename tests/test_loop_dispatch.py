"""engine.server.generation.LoopDispatch: the compute thread's steps reach the event loop in order, and the
steps that come while a wake-up is pending join it instead of writing another."""

import asyncio
import threading

from engine.server.generation import LoopDispatch


def test_pending_steps_join_one_wake_up_and_arrive_in_order():
    loop = asyncio.new_event_loop()
    try:
        wake_ups = []
        schedule = loop.call_soon_threadsafe
        loop.call_soon_threadsafe = lambda *a: wake_ups.append(a) or schedule(*a)
        dispatch, got = LoopDispatch(loop), []

        def steps(first: int) -> None:  # the compute thread: three steps of two events
            for step in range(first, first + 3):
                dispatch([(got.append, (step, 0)), (got.append, (step, 1))])

        compute = threading.Thread(target=steps, args=(0,))
        compute.start()
        compute.join()  # the loop is not running: all three steps wait for the same wake-up
        assert got == [] and len(wake_ups) == 1
        loop.run_until_complete(asyncio.sleep(0))
        assert got == [(s, i) for s in range(3) for i in range(2)]

        compute = threading.Thread(target=steps, args=(3,))  # drained: the next step wakes the loop again
        compute.start()
        compute.join()
        loop.run_until_complete(asyncio.sleep(0))
        assert len(wake_ups) == 2 and got == [(s, i) for s in range(6) for i in range(2)]
    finally:
        loop.close()


def test_a_closed_loop_drops_the_step_without_raising():
    loop = asyncio.new_event_loop()
    loop.close()
    got = []
    LoopDispatch(loop)([(got.append, "never")])  # the shutdown case: nobody is listening any more
    assert got == []
