"""`python -m dpx.orchestrator.driver --workspace WS --submission ID`: the driver process (spawn_driver starts it)."""
import sys

from .process import main

sys.exit(main())
