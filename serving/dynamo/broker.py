"""A ZMQ XSUB/XPUB proxy on loopback for Dynamo's event plane.

Dynamo's ZMQ publishers bind every interface unless they publish through a broker; with this
one they only connect, and every event socket stays on 127.0.0.1.
Run as `python -m serving.dynamo.broker XSUB_PORT XPUB_PORT [HOST]`.
"""

from __future__ import annotations

import sys

import zmq


def main(argv: list[str]) -> None:
    xsub_port, xpub_port = int(argv[0]), int(argv[1])
    host = argv[2] if len(argv) > 2 else "127.0.0.1"
    ctx = zmq.Context()
    inbound = ctx.socket(zmq.XSUB)
    inbound.bind(f"tcp://{host}:{xsub_port}")
    outbound = ctx.socket(zmq.XPUB)
    outbound.bind(f"tcp://{host}:{xpub_port}")
    zmq.proxy(inbound, outbound)


if __name__ == "__main__":
    main(sys.argv[1:])
