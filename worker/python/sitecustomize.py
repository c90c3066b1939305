"""app's worker: capture of W&B metrics, then the sitecustomize this file shadows.

The worker puts this file's directory first on a job's PYTHONPATH, so Python runs it at
every start instead of any other sitecustomize. It must stay cheap, also where bytecode is
not cached (PYTHONDONTWRITEBYTECODE): it imports nothing that is not already loaded and
compiles only itself. With APP_CAPTURE_FILE set (or, from an older worker, only
APP_METRICS_FILE) it puts two `wandb` finders on sys.meta_path, whose work
(`_app_capture.hooks`) loads on `import wandb` only. Then it runs the sitecustomize Python
would have found without us, in this module, so that its errors are reported by Python's
site exactly as before.
"""
import os
import sys


class _AppWandbFinder:
    """First on sys.meta_path: patches an installed wandb. Last: the built-in stand-in."""

    _app_capture_finder = True
    _broken = False

    def __init__(self, last):
        self.last = last

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "wandb" and not (self.last and fullname.startswith("wandb.")):
            return None
        if _AppWandbFinder._broken:
            return None
        try:
            from _app_capture import hooks

            return hooks.find_spec(self.last, fullname, path, target)
        except Exception as error:
            _AppWandbFinder._broken = True
            sys.stderr.write(f"[app] metric capture is off: {error!r}\n")
            return None


def _app_install_capture():
    if not (os.environ.get("APP_CAPTURE_FILE") or os.environ.get("APP_METRICS_FILE")):
        return
    if any(getattr(finder, "_app_capture_finder", False) for finder in sys.meta_path):
        return  # installed already, by another copy of this file further down PYTHONPATH
    sys.meta_path.insert(0, _AppWandbFinder(last=False))
    sys.meta_path.append(_AppWandbFinder(last=True))


def _app_cache_own_bytecode():
    """Writes this file's .pyc where Python was told not to (PYTHONDONTWRITEBYTECODE).

    Compiling this file costs each Python start about 2 ms; its cached bytecode about
    0.3 ms. The cache goes in the worker's directory, never in the user's tree, and only
    for this file; any failure (a read-only directory) just leaves it uncached.
    """
    cached = globals().get("__cached__")
    if not sys.dont_write_bytecode or not cached or os.path.exists(cached):
        return
    bootstrap = sys.modules["_frozen_importlib_external"]
    with open(__file__, "rb") as source_file:
        source = source_file.read()
    status = os.stat(__file__)
    code = compile(source, __file__, "exec", dont_inherit=True)
    os.makedirs(os.path.dirname(cached), exist_ok=True)
    data = bootstrap._code_to_timestamp_pyc(code, status.st_mtime, len(source))
    bootstrap._write_atomic(cached, data, 0o644)


def _app_shadowed_sitecustomize():
    """The spec of the next sitecustomize on sys.path after our directory, if any."""
    here = os.path.dirname(os.path.abspath(__file__))
    entries = [os.path.abspath(entry or os.curdir) for entry in sys.path]
    later = sys.path[entries.index(here) + 1:] if here in entries else sys.path
    # The frozen import machinery is always loaded; importlib.machinery may not be.
    spec = sys.modules["_frozen_importlib_external"].PathFinder.find_spec("sitecustomize", later)
    if spec is None or spec.loader is None or spec.origin in (None, "namespace"):
        return None
    if os.path.abspath(spec.origin) == os.path.abspath(__file__):
        return None
    return spec


try:
    _app_install_capture()
except Exception as _app_error:  # never stop the user's program for our sake
    sys.stderr.write(f"[app] metric capture is off: {_app_error!r}\n")
try:
    _app_cache_own_bytecode()
except Exception:
    pass
try:
    _app_spec = _app_shadowed_sitecustomize()
except Exception as _app_error:
    _app_spec = None
    sys.stderr.write(f"[app] could not look for the sitecustomize this one shadows: {_app_error!r}\n")
if _app_spec is not None:
    # Become that module: its code runs in our namespace with its own __file__ and spec.
    # An exception leaves this module and site prints it as "Error in sitecustomize".
    __file__ = _app_spec.origin
    __spec__ = _app_spec
    __loader__ = _app_spec.loader
    __cached__ = _app_spec.cached
    _app_spec.loader.exec_module(sys.modules[__name__])
