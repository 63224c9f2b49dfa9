"""setuptools' half of pyproject.toml: builds the native parts with CMake
and puts them in the wheel beside the pure-Python package.

The CMake build (KVSTRAND_BUILD_DIR, default build-wheel/) has only what
the wheel holds: libkvstrand.so, the Python module (for the interpreter
running this, sys.executable) and kvstrand-server, Release. It is
installed into a staging prefix laid out as the wheel is:

    kvstrand/_kvstrand*.so        RPATH $ORIGIN/.libs
    kvstrand/.libs/libkvstrand.so.*
    kvstrand/.bin/kvstrand-server (run by the kvstrand-server console entry, kvstrand/_server.py)

KVSTRAND_GPU selects the device backend (auto: cuda or hip where a device
and its SDK are present, else sim), as for a CMake build; KVSTRAND_CUDA_ROOT
names a CUDA toolkit elsewhere than /usr/local/cuda; KVSTRAND_BUILD_TYPE
the CMake build type (default Release: what an engine should run; the
suite's README check builds None, no optimisation, in half the time). `pip install -v .`
shows CMake's progress (the backend it chose among its first lines).
"""

import os
import re
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

ROOT = os.path.dirname(os.path.abspath(__file__))


def version():
    text = open(os.path.join(ROOT, "CMakeLists.txt"), encoding="utf-8").read()
    return re.search(r"project\(kvstrand VERSION (\d+\.\d+\.\d+)", text).group(1)


def pybind11_dir():
    """pybind11's CMake package where the pybind11 Python package provides it
    (a build with isolation); None: CMake finds a system one (pybind11-dev)."""
    try:
        import pybind11  # noqa: PLC0415
    except ImportError:
        return None
    return pybind11.get_cmake_dir()


class BuildWithCMake(build_py):
    def run(self):
        super().run()
        build = os.path.abspath(os.environ.get("KVSTRAND_BUILD_DIR") or os.path.join(ROOT, "build-wheel"))
        stage = os.path.join(build, "stage")
        configure = [
            "cmake", "-S", ROOT, "-B", build, "-Wno-dev", "-DCMAKE_BUILD_TYPE=" + os.environ.get("KVSTRAND_BUILD_TYPE", "Release"),
            "-DKVSTRAND_GPU=" + os.environ.get("KVSTRAND_GPU", "auto"),
            "-DKVSTRAND_TESTS=OFF", "-DKVSTRAND_BENCH=OFF", "-DKVSTRAND_EXAMPLES=OFF", "-DKVSTRAND_PYTHON=ON",
            "-DKVSTRAND_PYTHON_EXECUTABLE=" + sys.executable,
            # The staging prefix is the wheel's layout (the docstring).
            "-DKVSTRAND_PYTHON_INSTALL_DIR=.", "-DCMAKE_INSTALL_LIBDIR=kvstrand/.libs",
            "-DCMAKE_INSTALL_BINDIR=kvstrand/.bin",
            # Parses Asio's headers a quarter as often, and what most files
            # parse first once (as `make test` builds).
            "-DCMAKE_UNITY_BUILD=ON", "-DCMAKE_UNITY_BUILD_BATCH_SIZE=4", "-DKVSTRAND_PCH=ON",
        ]
        if os.environ.get("KVSTRAND_CUDA_ROOT"):
            configure.append("-DKVSTRAND_CUDA_ROOT=" + os.environ["KVSTRAND_CUDA_ROOT"])
        if shutil.which("ninja") and not os.path.exists(os.path.join(build, "CMakeCache.txt")):
            configure += ["-G", "Ninja"]
        if pybind11_dir():
            configure.append("-Dpybind11_DIR=" + pybind11_dir())
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 2)
        self.announce("kvstrand: building the native parts with CMake in " + build, level=2)
        subprocess.check_call(configure)
        subprocess.check_call(["cmake", "--build", build, "-j", jobs, "--target", "kvstrand_python", "kvstrand-server"])
        shutil.rmtree(stage, ignore_errors=True)
        subprocess.check_call(["cmake", "--install", build, "--prefix", stage], stdout=subprocess.DEVNULL)
        package = os.path.join(self.build_lib, "kvstrand")
        staged = os.path.join(stage, "kvstrand")
        for name in os.listdir(staged):
            if name.startswith("_kvstrand") and name.endswith(".so"):
                shutil.copy2(os.path.join(staged, name), package)
        os.makedirs(os.path.join(package, ".libs"), exist_ok=True)
        for name in os.listdir(os.path.join(staged, ".libs")):
            # The library under its SONAME only (libkvstrand.so.MAJOR.MINOR), what
            # the module loads: a wheel holds no symbolic links.
            if re.fullmatch(r"libkvstrand\.so\.\d+\.\d+", name):
                shutil.copy2(os.path.join(staged, ".libs", name), os.path.join(package, ".libs"))
        os.makedirs(os.path.join(package, ".bin"), exist_ok=True)
        shutil.copy2(os.path.join(staged, ".bin", "kvstrand-server"), os.path.join(package, ".bin"))


class BinaryDistribution(Distribution):
    """A wheel for this interpreter and platform: it holds native code."""

    def has_ext_modules(self):
        return True


setup(version=version(), cmdclass={"build_py": BuildWithCMake}, distclass=BinaryDistribution)
