"""``python -m geomx.scenario [FILE] [--set PATH=VALUE ...] [--write-docs MD]``."""

from geomx.scenario.command import main

raise SystemExit(main())
