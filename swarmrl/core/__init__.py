"""The ground floor: what every service, client and command imports, and nothing above it.

`config` (the settings base every service's config class derives from), `log` (log setup) and
`rundir` (run directories, the swarmrl home). It imports no service, client or command; the roof
(`swarmrl.cli`, `swarmrl.up`, the supervisor, launch, control plane, research) imports it, never the
reverse (`tests/unit/test_layers.py`).
"""
