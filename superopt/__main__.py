"""`python -m superopt ...`: the `superopt` command."""
import sys

from superopt.cli import main

sys.exit(main())
