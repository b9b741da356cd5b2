# The cffi binding of libfuse3's low-level API is compiled at install time
# (API mode: the C compiler checks every struct and callback signature).
from setuptools import setup

setup(cffi_modules=["ualinkd/fuse/_build.py:ffibuilder"])
