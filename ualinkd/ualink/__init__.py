"""The UALink manager, sans-IO: accel state, exports, local imports, NPA space, peers."""
