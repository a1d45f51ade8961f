"""`python -m minilm run|compare|serve|bench-serve ...`: the command line (cli.py)."""

import sys

from .cli import main

sys.exit(main())
