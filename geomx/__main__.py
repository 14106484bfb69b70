import sys

from geomx.cli import main

sys.exit(main())
