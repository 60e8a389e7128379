"""Runs a checking script with the PyPI packages it needs, from a virtual environment
made once when this Python lacks them.

    from python_packages import ensure_packages
    ensure_packages(venv_dir, ["onnx", "onnxruntime", "numpy"])
"""

import importlib
import os
import pathlib
import subprocess
import sys


def ensure_packages(venv: pathlib.Path, packages) -> None:
    """Returns when every package imports here; otherwise re-executes the calling
    script from `venv` (made and filled on first use). Exits with a message when the
    venv itself lacks them, so that a broken venv is not retried forever."""
    try:
        for package in packages:
            importlib.import_module(package)
        return
    except ImportError:
        pass
    python = venv / "bin" / "python3"
    # A venv's python3 is a link to the base interpreter, so whether this runs in the
    # venv is told by its prefix, not by the executable's path.
    if pathlib.Path(sys.prefix).resolve() == venv.resolve():
        sys.exit("%s: the virtual environment at %s lacks %s" % (os.path.basename(sys.argv[0]), venv, " ".join(packages)))
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", *packages], check=True)
    os.execv(str(python), [str(python), *sys.argv])
