"""python3 -m extract_hfserver --model-path M --port P --shm-dir D --layers a,b,c ..."""

import sys

from .server import main

sys.exit(main())
