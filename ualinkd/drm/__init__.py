"""The DRM core, sans-IO: ioctl dispatch rules, DrmFile handle tables, GEM objects, PRIME."""
