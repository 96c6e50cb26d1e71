import logging
import sys

from planner.cli import main

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
for noisy in ("aiconfigurator_core", "dynamo"):
    logging.getLogger(noisy).setLevel(logging.ERROR)
sys.exit(main(sys.argv[1:]))
