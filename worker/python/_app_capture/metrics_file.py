"""The one writer of the capture file, and the switch that turns capture off.

The capture file is APP_CAPTURE_FILE, a file of the worker's that it reads apart from the
job's own APP_METRICS_FILE, so a script that opens APP_METRICS_FILE with "w" neither
overwrites our lines nor is overwritten by them. A worker from before APP_CAPTURE_FILE
sets only APP_METRICS_FILE; then the lines go there, beside the user's own.

The worker reads each line as one JSON object, so a line must land whole even when other
code appends to the same file: every batch of lines goes out in one `os.write` on a
descriptor opened with O_APPEND, which the kernel places at the end of the file as a unit.
"""
import json
import os
import sys

_off_reason = None


def is_off():
    return _off_reason is not None


def turn_off(why):
    """Stops all capture for the rest of the process, saying so once on stderr."""
    global _off_reason
    if _off_reason is None:
        _off_reason = str(why) or type(why).__name__
        try:
            sys.stderr.write(f"[app] metric capture is off: {_off_reason}\n")
            sys.stderr.flush()
        except Exception:
            pass


def note(text):
    """One `[app]` line on stderr; never raises."""
    try:
        sys.stderr.write(f"[app] {text}\n")
        sys.stderr.flush()
    except Exception:
        pass


def target():
    """(variable, path) of the file to write: APP_CAPTURE_FILE, else APP_METRICS_FILE."""
    for variable in ("APP_CAPTURE_FILE", "APP_METRICS_FILE"):
        path = os.environ.get(variable)
        if path:
            return variable, path
    return "APP_CAPTURE_FILE", ""


class MetricsFile:
    """Appends `{"step": S, name: value, ...}` lines to the capture file."""

    def __init__(self, path, variable="APP_CAPTURE_FILE"):
        self.path = path
        self.variable = variable
        self.fd = None

    def open(self):
        """Opens the file now, so a bad path is reported at `wandb.init`, not mid-run."""
        if self.fd is None and not is_off():
            try:
                flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
                self.fd = os.open(self.path, flags, 0o644)
            except OSError as error:
                turn_off(f"cannot open {self.variable} {self.path}: {error.strerror}")
        return self.fd is not None

    def write_points(self, points_by_step):
        """Writes one line per step of `{step: {name: value}}`, all in one write."""
        if not points_by_step or not self.open():
            return
        lines = "".join(
            json.dumps({"step": step, **points}) + "\n" for step, points in points_by_step.items()
        )
        data = lines.encode()
        try:
            written = os.write(self.fd, data)
            # A regular file takes the whole buffer unless the disk is full or a signal
            # interrupts; finish the rest rather than lose it.
            while written < len(data):
                written += os.write(self.fd, data[written:])
        except OSError as error:
            turn_off(f"cannot write {self.variable} {self.path}: {error.strerror}")


_shared = None


def shared():
    """The process's one MetricsFile (all runs of a process share the worker's file)."""
    global _shared
    if _shared is None:
        variable, path = target()
        _shared = MetricsFile(path, variable)
    return _shared
