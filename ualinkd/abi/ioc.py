"""Linux `_IOC` ioctl number encoding (asm-generic/ioctl.h, x86-64 layout).

cmd = dir << 30 | size << 16 | type << 8 | nr, with dir bit 0 = WRITE (user → kernel,
"IN") and bit 1 = READ (kernel → user, "OUT").
"""

from __future__ import annotations

from dataclasses import dataclass

IOC_NONE = 0
IOC_WRITE = 1
IOC_READ = 2

_NRBITS, _TYPEBITS, _SIZEBITS, _DIRBITS = 8, 8, 14, 2
_NRSHIFT = 0
_TYPESHIFT = _NRSHIFT + _NRBITS
_SIZESHIFT = _TYPESHIFT + _TYPEBITS
_DIRSHIFT = _SIZESHIFT + _SIZEBITS

DRM_IOCTL_BASE = ord("d")
DRM_COMMAND_BASE = 0x40
DRM_COMMAND_END = 0xA0


def ioc(direction: int, type_: int, nr: int, size: int) -> int:
    if not (
        0 <= direction < 1 << _DIRBITS
        and 0 <= size < 1 << _SIZEBITS
        and 0 <= nr < 256
        and 0 <= type_ < 256
    ):
        raise ValueError("ioctl field out of range")
    return (direction << _DIRSHIFT) | (size << _SIZESHIFT) | (type_ << _TYPESHIFT) | nr


def ioc_dir(cmd: int) -> int:
    """_IOC_DIR(cmd)."""
    return (cmd >> _DIRSHIFT) & ((1 << _DIRBITS) - 1)


def ioc_nr(cmd: int) -> int:
    """_IOC_NR(cmd): the number inside its type's table."""
    return (cmd >> _NRSHIFT) & ((1 << _NRBITS) - 1)


def ioc_size(cmd: int) -> int:
    """_IOC_SIZE(cmd): the argument's size the number declares."""
    return (cmd >> _SIZESHIFT) & ((1 << _SIZEBITS) - 1)


def io(nr: int) -> int:
    return ioc(IOC_NONE, DRM_IOCTL_BASE, nr, 0)


def iow(nr: int, size: int) -> int:
    return ioc(IOC_WRITE, DRM_IOCTL_BASE, nr, size)


def iowr(nr: int, size: int) -> int:
    return ioc(IOC_READ | IOC_WRITE, DRM_IOCTL_BASE, nr, size)


@dataclass(frozen=True, slots=True)
class IoctlCmd:
    """A decoded ioctl number."""

    direction: int
    type: int
    nr: int
    size: int

    @classmethod
    def decode(cls, cmd: int) -> IoctlCmd:
        cmd &= 0xFFFFFFFF
        return cls(
            (cmd >> _DIRSHIFT) & ((1 << _DIRBITS) - 1),
            (cmd >> _TYPESHIFT) & 0xFF,
            cmd & 0xFF,
            (cmd >> _SIZESHIFT) & ((1 << _SIZEBITS) - 1),
        )

    @property
    def copies_in(self) -> bool:
        return bool(self.direction & IOC_WRITE)

    @property
    def copies_out(self) -> bool:
        return bool(self.direction & IOC_READ)

    def encode(self) -> int:
        return ioc(self.direction, self.type, self.nr, self.size)
