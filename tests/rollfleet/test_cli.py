"""SIGTERM unwinds like Ctrl-C, also from inside asyncio's callbacks (where `serving.serve`
spends its time): there, any other exception is logged and swallowed."""

import asyncio

import pytest

from rollfleet.cli import Terminated


class StopsOnData(asyncio.Protocol):
    """Raises what SIGTERM raises while asyncio is reading a socket for it."""

    def data_received(self, data: bytes) -> None:
        raise Terminated()


async def _serve_one_write() -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(StopsOnData, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"x")
    await writer.drain()
    await asyncio.sleep(2)  # a swallowed Terminated lets the loop run on to here
    server.close()


def test_terminated_raised_inside_a_transport_callback_stops_the_loop():
    with pytest.raises(Terminated):
        asyncio.run(_serve_one_write())
