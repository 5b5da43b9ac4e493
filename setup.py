"""Build glue: cffi compiles pylock._native from csrc/ (see csrc/_ffi_build.py)."""

import sys
import sysconfig

from setuptools import setup

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70
    from wheel.bdist_wheel import bdist_wheel  # type: ignore[no-redef]


class abi3_bdist_wheel(bdist_wheel):
    """Tag the wheel cp39-abi3, except where the limited API does not exist
    (free-threaded CPython, PyPy: their wheels carry their own tags)."""

    def finalize_options(self) -> None:
        if sys.implementation.name == "cpython" and not sysconfig.get_config_var("Py_GIL_DISABLED"):
            self.py_limited_api = "cp39"
        super().finalize_options()


setup(
    cffi_modules=["csrc/_ffi_build.py:ffibuilder"],
    cmdclass={"bdist_wheel": abi3_bdist_wheel},
)
