"""Build glue: cffi compiles pylock._native from csrc/ (see csrc/_ffi_build.py)."""

import sysconfig

from setuptools import setup

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70
    from wheel.bdist_wheel import bdist_wheel  # type: ignore[no-redef]


class abi3_bdist_wheel(bdist_wheel):
    """Tag the wheel cp39-abi3, except where the limited API does not exist."""

    def finalize_options(self) -> None:
        if not sysconfig.get_config_var("Py_GIL_DISABLED"):
            self.py_limited_api = "cp39"
        super().finalize_options()


setup(
    cffi_modules=["csrc/_ffi_build.py:ffibuilder"],
    cmdclass={"bdist_wheel": abi3_bdist_wheel},
)
