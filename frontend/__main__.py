"""``python -m frontend``: run one front-end node (the same as ``headwater frontend``)."""

import sys

from frontend.node import main

sys.exit(main())
