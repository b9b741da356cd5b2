"""Command-line entry points: `ualinkd` (node, pod) and `ualinkctl`."""
