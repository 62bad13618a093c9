"""``python -m frontend``: run one front-end node (the same as ``headwater frontend``)."""

import sys

from frontend.server import main

sys.exit(main())
