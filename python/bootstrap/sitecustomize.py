# spillway's bootstrap (design.md 6, docs/python.md).
#
# libspillway.so's constructor puts this file's directory first on PYTHONPATH
# when the library is preloaded into a Python interpreter, so Python imports
# this module at start-up in place of any other `sitecustomize`. It
#   1. arms a one-shot import hook that installs spillway as torch's CUDA
#      allocator right after `torch` is imported (spillway._bootstrap), and
#   2. runs the `sitecustomize` it shadows, if there is one, as Python would
#      have (its errors are reported by Python's own site machinery).
# It never makes start-up fail: a broken bootstrap gives one warning.
import os
import sys

# The `spillway` package that came with this library, relative to this file's
# directory: next to it in the build tree. `cmake --install` and the wheel
# install a copy with their layout's (cmake/install.cmake, setup.py).
PACKAGE_DIR = "spillway"


def _import_spillway():
    """Imports the package at PACKAGE_DIR as `spillway`, whatever sys.path holds:
    the Python that runs may not be the one it was installed for (a venv's
    spillway-run starting the system's python3), and another `spillway` on the
    path would not match this library."""
    import importlib.util  # already loaded by Python's start-up: costs nothing

    here = os.path.dirname(os.path.abspath(__file__))
    package = os.path.normpath(os.path.join(here, PACKAGE_DIR))
    spec = importlib.util.spec_from_file_location(
        "spillway", os.path.join(package, "__init__.py"), submodule_search_locations=[package])
    if spec is None or not os.path.isfile(spec.origin):
        raise ImportError("the spillway package is not at %s" % package)
    module = importlib.util.module_from_spec(spec)
    sys.modules["spillway"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules["spillway"]
        raise


def _arm():
    try:
        _import_spillway()
        from spillway import _bootstrap
        _bootstrap.arm()
    except Exception as e:  # contract 4: never fail the job
        sys.stderr.write("[spillway W] the Python bootstrap failed (%s: %s); the job runs on "
                         "PyTorch's own allocator\n" % (type(e).__name__, e))


def _chain():
    """Runs the next `sitecustomize` on sys.path, the one this module shadows."""
    import importlib.machinery  # already loaded by Python's start-up: costs nothing

    here = os.path.dirname(os.path.abspath(__file__))

    def ours(entry):
        try:
            return os.path.abspath(entry or os.curdir) == here
        except (TypeError, ValueError):
            return False

    # Each entry of ours, with the entry that followed it: it goes back in
    # front of that one, after whatever the chained module put first.
    removed = [(p, sys.path[i + 1:]) for i, p in enumerate(sys.path) if ours(p)]
    rest = [p for p in sys.path if not ours(p)]
    if importlib.machinery.PathFinder.find_spec("sitecustomize", rest) is None:
        return
    mine = sys.modules.pop("sitecustomize", None)
    sys.path[:] = rest  # in place: code that holds sys.path keeps the same list
    try:
        __import__("sitecustomize")
    except BaseException:
        # Python's site module reports it ("Error in sitecustomize"), as it
        # would without spillway; `import sitecustomize` then finds ours.
        sys.modules["sitecustomize"] = mine
        raise
    finally:
        # Back where it was, keeping what the chained module changed.
        for p, following in reversed(removed):
            at = next((sys.path.index(f) for f in following if f in sys.path), len(sys.path))
            sys.path.insert(at, p)


_arm()
_chain()
