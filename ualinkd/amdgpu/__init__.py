"""The amdgpu driver, sans-IO: BOs and their domains, GEM ioctls, the UALINK_HANDLE ioctl."""
