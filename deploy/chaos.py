#!/usr/bin/env python3
"""Chaos script: kills or pauses random workers of a local gridstream cluster
while a job runs, then reports detection and recovery times and whether the
results match a fault-free reference. Same as ``gridstream chaos``.

    .venv/bin/python deploy/chaos.py --workload taxi --faults 5 --kinds kill,pause
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gridstream.chaos import main

if __name__ == "__main__":
    sys.exit(main())
