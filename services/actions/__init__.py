"""The actions service: action-level scheduling of external resources (code sandboxes, model judges).

`model` (shared types) → `scheduler` (pure policy: static / fifo / elastic) → `sandbox` and `judge`
(resource managers) → `service` (NATS: requests in, results and records out).
"""
