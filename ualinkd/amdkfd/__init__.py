"""The emulated KFD (amdkfd): /dev/kfd's processes and ioctls, over the node's amdgpu devices.

Sans-IO like `drm/` and `amdgpu/`: `chardev.py` is kfd_chardev.c's dispatch and handlers,
`topology.py` the sysfs topology (kfd_topology.c) the daemon serves beside them.
"""
