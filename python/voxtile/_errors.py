"""The library's error kinds as exception classes (raised by the native module, one per kind)."""


class VoxtileError(Exception):
    """Base of every error voxtile raises; the message is one sentence naming the file or value."""


class IoError(VoxtileError, OSError):
    """Reading or writing a file failed at the OS level."""


class VolumeError(VoxtileError, ValueError):
    """A volume file is malformed or unsupported."""


class ModelError(VoxtileError, ValueError):
    """A model file (ONNX or manifest) is malformed or unsupported."""


class UnsupportedOps(ModelError):
    """The model uses operators voxtile lacks; ``ops`` lists (op, node, why) for every one."""


class GraphError(ModelError):
    """The model's graph is inconsistent (shapes, wiring)."""


class ChannelMismatch(VoxtileError, ValueError):
    """The array's channels are not the model's; ``expected`` and ``got`` are the counts."""


class BudgetTooSmall(VoxtileError, MemoryError):
    """The memory budget is below one batch at the window; ``needed``, ``budget`` (bytes),
    ``roi`` and ``batch`` say by how much. The window is never shrunk behind your back."""


class OutOfMemory(VoxtileError, MemoryError):
    """The device or host ran out of memory even at batch 1."""


class Cancelled(VoxtileError):
    """The run was cancelled (``Model.cancel()``); nothing was returned or written."""


class InvalidInput(VoxtileError, ValueError):
    """An argument or array voxtile cannot take (wrong dimensions, channels, values, flags)."""


class BackendError(VoxtileError, RuntimeError):
    """The device failed (driver, kernel compile, launch)."""


__all__ = [
    "VoxtileError", "IoError", "VolumeError", "ModelError", "UnsupportedOps", "GraphError",
    "ChannelMismatch", "BudgetTooSmall", "OutOfMemory", "Cancelled", "InvalidInput", "BackendError",
]
