"""Type stubs of the voxtile package (the docstrings are in __init__.py)."""

import os
from dataclasses import dataclass
from typing import Any, Callable, Literal, Optional, Sequence, Union, overload

import numpy as np
import numpy.typing as npt

from ._errors import (
    BackendError as BackendError,
    BudgetTooSmall as BudgetTooSmall,
    Cancelled as Cancelled,
    ChannelMismatch as ChannelMismatch,
    GraphError as GraphError,
    InvalidInput as InvalidInput,
    IoError as IoError,
    ModelError as ModelError,
    OutOfMemory as OutOfMemory,
    UnsupportedOps as UnsupportedOps,
    VolumeError as VolumeError,
    VoxtileError as VoxtileError,
)

__version__: str

_Path = Union[str, os.PathLike[str]]
_Progress = Union[None, bool, Callable[[int, int], Any]]
_Triple = Union[float, Sequence[float]]

@dataclass
class Segmentation:
    labels: npt.NDArray[Union[np.uint8, np.uint16]]
    probabilities: Optional[npt.NDArray[np.float32]]
    logits: Optional[npt.NDArray[np.float32]]
    classes: Optional[list[str]]
    report: dict[str, Any]

class Model:
    path: str
    def __init__(
        self,
        path: _Path,
        device: str = "auto",
        memory_budget: Optional[Union[str, int]] = None,
        manifest: Optional[_Path] = None,
        **overrides: Any,
    ) -> None: ...
    @property
    def info(self) -> dict[str, Any]: ...
    @overload
    def segment(
        self,
        array: Any,
        spacing: Optional[Sequence[float]] = None,
        affine: Optional[Any] = None,
        *,
        probabilities: Literal[False] = False,
        logits: Literal[False] = False,
        nonfinite: Literal["raise", "clean"] = "raise",
        progress: _Progress = None,
    ) -> npt.NDArray[Union[np.uint8, np.uint16]]: ...
    @overload
    def segment(
        self,
        array: Any,
        spacing: Optional[Sequence[float]] = None,
        affine: Optional[Any] = None,
        *,
        probabilities: bool = False,
        logits: bool = False,
        nonfinite: Literal["raise", "clean"] = "raise",
        progress: _Progress = None,
    ) -> Union[Segmentation, npt.NDArray[Union[np.uint8, np.uint16]]]: ...
    def cancel(self) -> None: ...

def segment_file(in_path: _Path, out_path: _Path, model: Union[Model, _Path], **options: Any) -> None: ...
def plan(
    model: Union[Model, _Path],
    shape: Sequence[int],
    memory_budget: Optional[Union[str, int]] = None,
    device: Optional[str] = None,
    **options: Any,
) -> dict[str, Any]: ...
def sliding_window_inference(
    inputs: Any,
    model: Union[Model, _Path],
    roi_size: Union[int, Sequence[int]],
    overlap: _Triple = 0.5,
    mode: Literal["gaussian", "constant"] = "gaussian",
    sigma_scale: _Triple = 0.125,
    padding_mode: Literal["constant", "replicate"] = "constant",
    cval: float = 0.0,
    sw_batch_size: Optional[int] = None,
    device: Optional[str] = None,
    memory_budget: Optional[Union[str, int]] = None,
    progress: _Progress = None,
) -> Any: ...
