"""The only FUSE code: a cffi binding of libfuse3's low-level API driven from trio
(`lowlevel`), the node's file tree (`tree`) and caller-fd resolution (`procfd`).

`backend` is the contract with the daemon; import submodules explicitly.
"""
