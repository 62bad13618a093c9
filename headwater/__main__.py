"""`python -m headwater` is the `headwater` command."""

import sys

from headwater.cli import main

sys.exit(main())
