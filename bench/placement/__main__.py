"""`python -m bench.placement`: see bench/README.md."""

import sys

from bench.placement.cli import main

if __name__ == "__main__":
    sys.exit(main())
