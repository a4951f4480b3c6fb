"""gRPC's TCP transport in every service process: importing this module, before anything
imports grpc, chooses the endpoints of gRPC's I/O manager rather than the EventEngine ones the
pinned grpcio uses by default. Each service's ``__main__`` imports it first, since gRPC reads
``GRPC_EXPERIMENTS`` once, when it loads.

Measured between two processes of this machine, the I/O manager's endpoints spend a fifth to a
third less CPU per MB moved and deliver a small message sooner (docs/performance.md, "The gRPC
transport"); every call between the services rides on them. A ``GRPC_EXPERIMENTS`` set in the
environment (an operator's choice; empty for gRPC's own defaults) is kept.

Only the services' event loops use it: a blocking channel on the I/O manager whose first
connection failed does not connect again between its calls, so blocking clients (the local
launcher's health checks, the probe, the admin CLI) keep gRPC's defaults.
"""

import os
import sys

EXPERIMENTS = "-event_engine_client,-event_engine_listener,-event_engine_for_all_other_endpoints"

# False when grpc had been loaded already, and the choice came too late to take effect.
CHOSEN_IN_TIME = "grpc" not in sys.modules

os.environ.setdefault("GRPC_EXPERIMENTS", EXPERIMENTS)
