"""The ioctl ABI: `_IOC` encoding, struct layouts (construct), constants. No I/O here."""
