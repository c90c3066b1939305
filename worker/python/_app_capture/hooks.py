"""What the `wandb` finders of sitecustomize do once Python looks for `wandb`.

- The first finder on sys.meta_path: when the installed wandb is found, it imports as
  usual and is patched right after its module runs (real_wandb.py).
- The last finder, consulted only when no finder found a `wandb`: app's built-in module
  (wandb_builtin.py), and stub modules for `wandb.<anything>` under it.
"""
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))

# Set while we ask the other finders, in case one of them looks for `wandb` through
# sys.meta_path again.
_searching = False


def builtin_spec():
    import importlib.util

    # A package (empty __path__) so that `import wandb.sdk.wandb_run` reaches our stubs.
    return importlib.util.spec_from_file_location(
        "wandb", os.path.join(_HERE, "wandb_builtin.py"), submodule_search_locations=[]
    )


def find_spec(last, fullname, path, target):
    if last:
        if fullname == "wandb":
            return builtin_spec()
        if getattr(sys.modules.get("wandb"), "__app_builtin__", False):
            from _app_capture import noop

            return noop.stub_submodule_spec(fullname)
        return None
    global _searching
    if _searching:
        return None
    _searching = True
    try:
        spec = _find_installed(fullname, path, target)
    finally:
        _searching = False
    if spec is None:
        return None  # the last finder answers with the built-in module
    if spec.loader is None or spec.origin in (None, "namespace"):
        # A `wandb/` folder without __init__.py (W&B's own run folder in the script's
        # directory) would import as an empty namespace package: not an installed wandb.
        return builtin_spec()
    _patch_after_exec(spec)
    return spec


def _find_installed(fullname, path, target):
    """The spec the other finders give for `fullname`, as if we were not there."""
    for finder in list(sys.meta_path):
        if getattr(finder, "_app_capture_finder", False):
            continue  # ours, first and last
        find_spec = getattr(finder, "find_spec", None)
        if find_spec is not None:
            spec = find_spec(fullname, path, target)
            if spec is not None:
                return spec
    return None


def _patch_after_exec(spec):
    """Wraps this one loader's exec_module: run wandb's module, then patch it."""
    loader = spec.loader
    real_exec_module = loader.exec_module

    def exec_module(module):
        if module.__name__ != "wandb":  # a loader shared by many modules (zipimport)
            return real_exec_module(module)
        try:
            real_exec_module(module)
        finally:
            try:
                del loader.exec_module
            except AttributeError:
                pass
        _guarded("patch", module)

    try:
        loader.exec_module = exec_module  # shadows the method on this instance only
    except (AttributeError, TypeError):
        from _app_capture import metrics_file

        metrics_file.turn_off(f"cannot hook the loader of wandb ({type(loader).__name__})")


def _guarded(step, *args):
    try:
        from _app_capture import real_wandb

        getattr(real_wandb, step)(*args)
    except Exception as error:
        from _app_capture import metrics_file

        metrics_file.turn_off(f"while hooking wandb ({step}): {error!r}")
