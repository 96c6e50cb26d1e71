import logging
import sys

from serving.serve.cli import serve

logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
sys.exit(serve(sys.argv[1:]))
