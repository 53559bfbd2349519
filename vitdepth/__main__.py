import sys

from vitdepth.cli import main

sys.exit(main())
