"""The kvstrand-server console entry of an installed wheel: runs the server
binary the wheel holds (kvstrand/.bin/kvstrand-server), with the same
arguments, in this process's place."""

import os
import sys


def binary():
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), ".bin", "kvstrand-server")


def main():
    path = binary()
    if not os.access(path, os.X_OK):
        sys.stderr.write(f"kvstrand-server: {path} is not there: this kvstrand was not installed from its wheel "
                         "(pip install .); a CMake build has it as BUILD/kvstrand-server\n")
        return 1
    os.execv(path, [path, *sys.argv[1:]])
    return 1  # not reached: execv replaces this process


if __name__ == "__main__":
    sys.exit(main())
