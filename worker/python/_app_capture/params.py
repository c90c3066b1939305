"""The run's parameters (APP_PARAMS) and how they enter a W&B config.

In a W&B sweep the agent's parameters are merged over the config the script passes to
`wandb.init` and then locked: wandb/sdk/wandb_run.py does
`self._config.merge_locked(sweep_config, user="sweep", _allow_val_change=True)`, and a later
`config.update` of a locked key is ignored with "Config item 'lr' was locked by 'sweep'
(ignored update)." Both the built-in module and the patched real one do the same.

The worker leaves APP_PARAMS out when the parameters' JSON is over 32 KiB (Linux caps one
environment string at 128 KiB); then they are read from the file APP_PARAMS_FILE names,
if it does, else wandb.config keeps what the script gave it, and one note says so.
"""
import json
import os

from _app_capture import metrics_file

_noted = set()


def _note_once(text):
    if text not in _noted:
        _noted.add(text)
        metrics_file.note(text)


def load():
    """The run's parameters as a dict; {} (with one note) when they cannot be had."""
    text = os.environ.get("APP_PARAMS")
    source = "APP_PARAMS"
    if text is None:
        path = os.environ.get("APP_PARAMS_FILE")
        if not path:
            _note_once(
                "the run's parameters are not in wandb.config: APP_PARAMS is not set"
                " (the worker leaves it out over 32 KiB) and no APP_PARAMS_FILE names them"
            )
            return {}
        source = f"APP_PARAMS_FILE {path}"
        try:
            with open(path, encoding="utf-8") as file:
                text = file.read()
        except (OSError, UnicodeDecodeError) as error:
            _note_once(f"the run's parameters are not in wandb.config: cannot read {source}: {error}")
            return {}
    if not text:
        return {}
    try:
        params = json.loads(text)
    except ValueError as error:
        _note_once(f"the run's parameters are not in wandb.config: {source} is not JSON: {error}")
        return {}
    if not isinstance(params, dict):
        _note_once(f"the run's parameters are not in wandb.config: {source} is not a JSON object")
        return {}
    return params


def merge_dicts(destination, source):
    """W&B's config_util.merge_dicts: nested dicts merge key by key, anything else replaces.

    Unlike W&B's, it copies a nested dict before merging into it, so the dict a script
    passed to `wandb.init(config=...)` is left as it was.
    """
    for key, value in source.items():
        if isinstance(value, dict) and isinstance(destination.get(key), dict):
            destination[key] = merge_dicts(dict(destination[key]), value)
        else:
            destination[key] = value
    return destination
