"""Pods of real node daemons in network and mount namespaces: the supervisor that
`ualinkd pod --netns` runs (pod.py), what each node's mount namespace is made of
(nodeinit.py, run by `python -m ualinkd.netns.nodeinit` at every node start, so this
package imports nothing), and a libualink client driven inside a node (agent.py).

Tests reach it through `ualinkd.testing` (the pytest plugin, the fault command line).
"""
