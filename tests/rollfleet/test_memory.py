"""rollfleet/memory.py: a peak that came and went inside the block is caught, in this process
and in another one; memory that stayed flat reads as flat."""

from __future__ import annotations

import subprocess
import sys
import time

from rollfleet.memory import PeakRss, rss_mib


def test_a_peak_that_came_and_went_inside_the_block_is_counted_here_and_in_another_process():
    grow = ("import sys, time\nprint('ready', flush=True)\nsys.stdin.readline()\n"
            "b = b'\\x01' * (96 * 2**20)\nprint('held', flush=True)\nsys.stdin.readline()\n"
            "del b\nprint('freed', flush=True)\ntime.sleep(60)")
    other = subprocess.Popen([sys.executable, "-c", grow], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)

    def tell(line: str) -> None:
        other.stdin.write("\n")
        other.stdin.flush()
        assert other.stdout.readline() == line

    try:
        assert other.stdout.readline() == "ready\n"
        with PeakRss({"here": "self", "other": other.pid}, every_s=0.005) as rss:
            block = b"\x01" * (64 * 2**20)  # every page written (a zeroed one may be left unmapped)
            tell("held\n")
            time.sleep(0.1)  # both held for 20 samples
            del block
            tell("freed\n")
        above = rss.above_start_mib()
        assert 56 <= above["here"] < 200 and 84 <= above["other"] < 200, above
        assert rss_mib(other.pid) < rss.start["other"] + 48  # it went back down before the end
    finally:
        other.kill()
        other.wait()


def test_memory_that_stayed_flat_reads_as_flat():
    with PeakRss({"here": "self"}) as rss:
        sum(range(1000))
    assert 0 <= rss.above_start_mib()["here"] < 8
