"""ualinkd: a userspace emulator of amdgpu UALink scale-up memory sharing."""

__version__ = "0.1.0"
