import sys

from .agent import main

sys.exit(main())
