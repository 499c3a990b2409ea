"""Build of collcomm's optional native core (collcomm/native/_shmcore.c).

Everything else is in pyproject.toml. The extension is optional: where it cannot be
compiled (no C compiler, not Linux, CC=false) the build says why and installs the
pure-Python package, which works the same, only slower for small messages.
"""
import glob
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class optional_build_ext(build_ext):
    """build_ext that turns a failed compile into a warning instead of a failed install."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 - any failure: install without it
            self._skip(exc)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001 - compiler missing or failing
            self._skip(exc)

    @staticmethod
    def _skip(exc: BaseException) -> None:
        sys.stderr.write(
            f"WARNING: collcomm's native core was not built ({type(exc).__name__}: {exc}); "
            "collcomm works without it (pure Python, slower for small messages)\n")


ext_modules = []
if sys.platform.startswith("linux"):
    ext_modules.append(Extension(
        "collcomm.native._shmcore",
        sources=["collcomm/native/_shmcore.c"],
        # every other C file there is #included by _shmcore.c (a change to one rebuilds)
        depends=sorted(p for p in glob.glob("collcomm/native/_*.c")
                       if not p.endswith("_shmcore.c")),
        # no fused multiply-add: results must match numpy's bit for bit
        extra_compile_args=["-O3", "-ffp-contract=off", "-fno-fast-math"],
        optional=True,
    ))

setup(ext_modules=ext_modules, cmdclass={"build_ext": optional_build_ext})
