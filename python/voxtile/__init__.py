"""voxtile: segment large 3D medical volumes with an ONNX 3D CNN, window by window, in planned memory.

Arrays in, arrays out, inside the pipelines you already run (MONAI transforms, nnU-Net-style
predictors, Dask or Ray over a cluster)::

    import nibabel as nib, voxtile

    model = voxtile.Model("net.onnx", device="auto", memory_budget="4GiB")
    img = nib.load("ct.nii.gz")
    labels = model.segment(img.get_fdata(dtype="float32"), affine=img.affine)

- ``Model(path, device="auto", memory_budget=None, manifest=None, **overrides)`` loads the
  model once (with its manifest, ``NAME.toml`` beside ``NAME.onnx``) and keeps it ready on its
  device; ``model.segment(array, spacing=None, affine=None)`` returns the label map, exactly the
  labels ``voxtile segment`` writes for a file read as that array.
- ``segment_file(in_path, out_path, model, **options)``: the command line's whole path for one
  case (readers, manifest, resampling, outputs, report).
- ``plan(model, shape, memory_budget=None, device=None)``: the memory plan as a dict.
- ``sliding_window_inference(inputs, model, roi_size, overlap=0.5, mode="gaussian",
  sigma_scale=0.125)``: MONAI's inferer's result (blended logits) for NumPy arrays and CPU
  PyTorch tensors (read in place through DLPack).

Errors are ``VoxtileError`` subclasses named after the library's kinds (``BudgetTooSmall``,
``UnsupportedOps``, ``ChannelMismatch``, ``InvalidInput``, ...). The GIL is released while a
model runs; Ctrl-C stops the run (``KeyboardInterrupt``), and so does ``model.cancel()`` from
another thread (``Cancelled``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np

from . import _voxtile
from ._errors import (
    BackendError,
    BudgetTooSmall,
    Cancelled,
    ChannelMismatch,
    GraphError,
    InvalidInput,
    IoError,
    ModelError,
    OutOfMemory,
    UnsupportedOps,
    VolumeError,
    VoxtileError,
)

__version__ = _voxtile.__version__

__all__ = [
    "Model", "Segmentation", "segment_file", "plan", "sliding_window_inference",
    "VoxtileError", "IoError", "VolumeError", "ModelError", "UnsupportedOps", "GraphError",
    "ChannelMismatch", "BudgetTooSmall", "OutOfMemory", "Cancelled", "InvalidInput", "BackendError",
]

# The dtypes the native side reads (float32 in place, the other two converted there).
_NATIVE = (np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.int16))
# DLPack's device types of host and CUDA memory.
_DLPACK_CPU = 1
_DLPACK_CUDA = 2


def _flags(options: dict) -> list:
    """Keyword arguments as ``voxtile segment`` / ``voxtile plan`` flags: ``key=value`` becomes
    ``--key=value`` (underscores as dashes), ``True`` the flag alone, ``False`` and ``None`` leave
    it out, a sequence is joined by commas (``roi=(96, 96, 96)`` is ``--roi=96,96,96``)."""
    out = []
    for key, value in options.items():
        if value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            out.append(flag)
            continue
        if isinstance(value, (list, tuple)):
            value = ",".join(str(v) for v in value)
        elif isinstance(value, os.PathLike):
            value = os.fspath(value)
        out.append(f"{flag}={value}")
    return out


def _on_cuda(x: Any) -> bool:
    """Whether ``x`` is a DLPack tensor in CUDA memory."""
    return hasattr(x, "__dlpack_device__") and x.__dlpack_device__()[0] == _DLPACK_CUDA


def _host_array(x: Any) -> tuple:
    """``x`` as a NumPy array without a copy where possible, and whether it was a PyTorch tensor.
    A tensor on a GPU is refused here (only ``sliding_window_inference`` reads CUDA tensors in
    place): a silent copy to the host would hide what it costs."""
    if isinstance(x, np.ndarray):
        return x, False
    torch_like = type(x).__module__.startswith("torch")
    if hasattr(x, "__dlpack_device__"):
        device_type = x.__dlpack_device__()[0]
        if device_type != _DLPACK_CPU:
            raise InvalidInput(
                "a tensor on a GPU (DLPack device type %d): Model.segment takes host (CPU) "
                "memory; voxtile.sliding_window_inference reads a CUDA tensor in place, or move "
                "it with tensor.cpu() (a copy)" % device_type)
        if hasattr(x, "detach"):
            x = x.detach()
        return np.from_dlpack(x), torch_like
    return np.asarray(x), torch_like


def _as_input(x: np.ndarray) -> np.ndarray:
    """A dtype the native side reads: float32, float16 and int16 as they are, other numbers as a
    float32 copy."""
    if x.dtype in _NATIVE and x.dtype.isnative:
        return x
    if x.dtype.kind not in "biuf":
        raise InvalidInput(f"expected a numeric array, got dtype {x.dtype}")
    return x.astype(np.float32)


def _triple(value: Any, name: str, kind: type) -> list:
    """One value or three (per axis) as a list of three."""
    v = np.asarray(value).ravel().tolist()
    if len(v) == 1:
        v = v * 3
    if len(v) != 3:
        raise InvalidInput(f"{name} takes one value or three (D, H, W), got {value!r}")
    return [kind(a) for a in v]


class _Progress:
    """``progress`` as the native side calls it: a callable ``(done, total)``, ``True`` for a
    tqdm bar (a plain line on stderr without tqdm), ``None``/``False`` for nothing."""

    def __init__(self, progress: Any, what: str = "windows"):
        self.bar = None
        self.what = what
        if callable(progress):
            self.call = progress
        elif progress:
            self.call = self._draw
        else:
            self.call = None

    def _draw(self, done: int, total: int) -> None:
        if self.bar is None:
            try:
                from tqdm.auto import tqdm
                self.bar = tqdm(total=total, unit=" " + self.what)
            except ImportError:
                self.bar = False
        if self.bar:
            self.bar.total = total
            self.bar.update(done - self.bar.n)
        else:
            sys.stderr.write(f"\rvoxtile: {done}/{total} {self.what}")
            sys.stderr.flush()

    def close(self) -> None:
        if self.bar:
            self.bar.close()
        elif self.bar is False:
            sys.stderr.write("\n")


@dataclasses.dataclass
class Segmentation:
    """What ``Model.segment`` returns when probabilities or logits are asked for.

    Attributes:
        labels: (D, H, W) label map on the array's grid, uint8 (uint16 when a label value
            exceeds 255).
        probabilities: (C, D, H, W) float32 averaged probabilities (after the activation), or None.
        logits: (C, D, H, W) float32 averaged raw outputs, or None.
        classes: one name per output channel (the manifest's ``classes``), or None.
        report: times, window, batch, memory and settings of the run (``--report``'s fields).
    """

    labels: np.ndarray
    probabilities: Optional[np.ndarray]
    logits: Optional[np.ndarray]
    classes: Optional[list]
    report: dict


class Model:
    """An ONNX model loaded once and held ready on its device, run on arrays.

    ``Model(path, device="auto", memory_budget=None, manifest=None, **overrides)``

    Args:
        path: the ``.onnx`` file. Its manifest (``NAME.toml`` or ``NAME.json`` beside it) gives
            the window, normalisation, spacing, orientation, classes and label values, as for
            ``voxtile segment``.
        device: ``"auto"`` (CUDA if present, else the CPU), ``"cpu"``, ``"cuda"``, ``"cuda:N"``,
            or a list such as ``"cuda:0,1"`` (one volume's windows split across the GPUs).
        memory_budget: what a run may use, e.g. ``"4GiB"`` (device memory on CUDA, the host
            working set on CPU); the batch is planned under it, the window never shrinks.
            None: 80% of free device memory, or half the memory left to the process.
        manifest: a manifest to read instead of the one beside the model.
        **overrides: any of ``voxtile segment``'s flags that shape the result, beating the
            manifest as typed flags do: ``roi=96`` or ``(96, 96, 96)``, ``overlap=0.5``,
            ``blend="gaussian"``, ``sigma_scale``, ``placement="nnunet"``, ``batch``,
            ``pad="edge"``, ``axis_order="zyx"``, ``normalize="zscore"``,
            ``spacing=(1.5, 1.5, 1.5)`` (the voxel size to resample to) or ``"none"``,
            ``tta=True`` (or ``"0,1"``), ``activation``, ``orientation="RAS"``,
            ``keep_largest=True``, ``fill_holes``, ``min_component_ml``, ``allow_small_roi``.
            Flags that name files (``probabilities=``, ``preview=``, ...) belong to
            ``segment_file``.

    Calls on one model take turns (the GIL is released while one runs); use one model per
    thread or per worker to run in parallel. ``model.info`` says what the model is.

    Example::

        model = voxtile.Model("deepbrain.onnx", device="cpu")
        img = nib.load("head_t1_128.nii.gz")
        labels = model.segment(np.asarray(img.dataobj, dtype=np.float32), affine=img.affine)
    """

    def __init__(self, path: Union[str, os.PathLike], device: str = "auto",
                 memory_budget: Optional[Union[str, int]] = None,
                 manifest: Optional[Union[str, os.PathLike]] = None, **overrides: Any):
        self.path = os.fspath(path)
        self._options = dict(device=device, memory_budget=memory_budget, manifest=manifest,
                             **overrides)
        self._session = _voxtile.Session(self.path, _flags(self._options))
        self._windows: dict = {}

    def __repr__(self) -> str:
        return f"voxtile.Model({self.path!r}, device={self._options['device']!r})"

    def __reduce__(self):
        # Sent to another process (Dask, Ray, multiprocessing): made again there from its file.
        return (_rebuild, (self.path, self._options))

    @property
    def info(self) -> dict:
        """What the model is: input (name, channels, fixed spatial size), output (channels),
        receptive field, parameters, ops, output activation, the manifest (with its path), the
        device, the memory budget (bytes and where it came from), class names, label values."""
        return json.loads(self._session.info())

    def segment(self, array: Any, spacing: Optional[Sequence[float]] = None,
                affine: Optional[Any] = None, *, probabilities: bool = False,
                logits: bool = False, nonfinite: str = "raise", progress: Any = None):
        """Segment an array; returns the label map, or a ``Segmentation`` when
        ``probabilities`` or ``logits`` is asked for.

        Args:
            array: (D, H, W) or (C, D, H, W), channels first, in the axes of the file it came
                from (nibabel's i, j, k; for a nibabel 4-D image, ``np.moveaxis(a, -1, 0)``).
                float32 is read in place whatever its strides (no copy unless normalisation or
                orientation needs one); float16 and int16 are converted without the GIL; other
                numbers are copied to float32. A PyTorch CPU tensor is read through DLPack.
            spacing: the voxel size (mm) along the array's three spatial axes.
            affine: the 4x4 voxel-to-world matrix (``img.affine``). With it, the array goes
                through what ``voxtile segment`` does with a file (orientation, resampling):
                the labels are bitwise those the command writes for that file. Its column norms
                are the spacing unless ``spacing`` is given. A model whose manifest resamples or
                reorients needs one of them.
            probabilities: also return the averaged probabilities.
            logits: also return the averaged raw outputs.
            nonfinite: ``"raise"`` (default): NaN or infinite values are an ``InvalidInput``;
                ``"clean"``: read NaN as 0 and clamp infinities, as the command reads a file.
            progress: a callable ``progress(done, total)`` (windows over all passes), ``True``
                for a tqdm bar, or None.

        Raises:
            InvalidInput: wrong dimensions, values or arguments. ChannelMismatch: the array's
            channels are not the model's. BudgetTooSmall: the memory budget is below one batch.
            Cancelled: ``model.cancel()`` was called. KeyboardInterrupt: Ctrl-C stopped it.
        """
        x, _ = _host_array(array)
        if x.ndim == 3:
            x = x[np.newaxis]
        if x.ndim != 4:
            raise InvalidInput(
                f"expected a (D, H, W) or (C, D, H, W) array, got shape {tuple(x.shape)}")
        if 0 in x.shape:
            raise InvalidInput(f"the array is empty: shape {tuple(x.shape)}")
        cin = self._session.input_channels
        if x.shape[0] != cin:
            hint = (" (channels come first: np.moveaxis(array, -1, 0))"
                    if x.shape[-1] == cin else "")
            err = ChannelMismatch(
                f"the array has {x.shape[0]} channel(s) on its first axis but {self.path} "
                f"expects {cin}{hint}")
            err.expected, err.got = cin, x.shape[0]
            raise err
        if nonfinite not in ("raise", "clean"):
            raise InvalidInput(f'nonfinite takes "raise" or "clean", not {nonfinite!r}')
        aff = None
        if affine is not None:
            a = np.asarray(affine, dtype=np.float64)
            if a.shape != (4, 4):
                raise InvalidInput(f"the affine must be 4x4, got shape {a.shape}")
            aff = a.tolist()
        sp = None if spacing is None else _triple(spacing, "spacing", float)
        bar = _Progress(progress)
        try:
            labels, probs, raw, report = self._session.run(
                _as_input(x), aff, sp, probabilities, logits, nonfinite == "clean", bar.call)
        finally:
            bar.close()
        if not (probabilities or logits):
            return labels
        report = json.loads(report)
        return Segmentation(labels, probs, raw, self.info.get("classes"), report)

    def cancel(self) -> None:
        """Stop the run in progress on this model from another thread: it raises
        ``Cancelled`` and returns nothing."""
        self._session.cancel()
        for w in list(self._windows.values()):
            w.cancel()

    def _window(self, settings: tuple) -> Any:
        """The sliding-window engine for these settings (the last one is kept)."""
        w = self._windows.get(settings)
        if w is None:
            w = _voxtile.Window(self.path, *settings)
            self._windows = {settings: w}
        return w


def _rebuild(path: str, options: dict) -> Model:
    return Model(path, **options)


def _model_path(model: Union[Model, str, os.PathLike]) -> str:
    return model.path if isinstance(model, Model) else os.fspath(model)


def segment_file(in_path: Union[str, os.PathLike], out_path: Union[str, os.PathLike],
                 model: Union[Model, str, os.PathLike], **options: Any) -> None:
    """Segment one file as ``voxtile segment IN -m MODEL -o OUT`` does, the whole path: the
    readers (NIfTI, NRRD, MetaImage, DICOM folders), the manifest, resampling, the outputs
    (committed together, nothing left half-written) and the report.

    ``options`` are the command's flags as keyword arguments: ``device="cpu"``,
    ``memory_budget="4GiB"``, ``probabilities="p.nii.gz"``, ``report="r.json"``, ``tta=True``,
    ``force=True``, ``preview="seg.png"``... With a ``Model``, its path and the options it was
    made with are used (the file is read again: to keep one model loaded over many cases, use
    ``Model.segment`` on arrays). Ctrl-C stops it and writes nothing.
    """
    if isinstance(model, Model):
        options = {**model._options, **options}
    argv = [os.fspath(in_path), "-m", _model_path(model), "-o", os.fspath(out_path)]
    _voxtile.segment(argv + _flags(options))


def plan(model: Union[Model, str, os.PathLike], shape: Sequence[int],
         memory_budget: Optional[Union[str, int]] = None, device: Optional[str] = None,
         **options: Any) -> dict:
    """The memory plan for a model and a volume, as ``voxtile plan --json`` gives it: the window
    (``roi``), the ``batch`` chosen under the budget, the windows, and the predicted memory by
    part (weights, activations, workspace, staging, accumulators), with the budget's source.

    Args:
        model: a ``Model`` (planned on its device and budget, with its settings) or a path
            (then ``memory_budget``, ``device`` and ``voxtile plan``'s flags as keyword
            arguments: ``roi``, ``batch``, ``overlap``, ``placement``, ``spacing``,
            ``orientation``, ``axis_order``, ``manifest``, ``logits``).
        shape: the volume's (D, H, W) as the network sees it (after any resampling).
    """
    dhw = [int(s) for s in shape]
    if len(dhw) != 3 or min(dhw) <= 0:
        raise InvalidInput(f"shape takes three positive sizes (D, H, W), got {shape!r}")
    if isinstance(model, Model):
        if memory_budget is not None or device is not None or options:
            raise InvalidInput(
                "plan(Model, ...) plans for the model as it was made; for other settings give "
                "the model's path with them")
        return json.loads(model._session.plan(dhw))
    argv = ["-m", os.fspath(model), "--volume", "x".join(map(str, dhw))]
    flags = _flags(dict(memory_budget=memory_budget, device=device, **options))
    return json.loads(_voxtile.plan(argv + flags))


def sliding_window_inference(inputs: Any, model: Union[Model, str, os.PathLike],
                             roi_size: Union[int, Sequence[int]], overlap: Any = 0.5,
                             mode: str = "gaussian", sigma_scale: Any = 0.125,
                             padding_mode: str = "constant", cval: float = 0.0,
                             sw_batch_size: Optional[int] = None, device: Optional[str] = None,
                             memory_budget: Optional[Union[str, int]] = None,
                             progress: Any = None) -> Any:
    """MONAI's ``sliding_window_inference`` with an ONNX model run by voxtile: the same window
    placement, importance map (``mode``, ``sigma_scale``), padding and result, the blended raw
    outputs (logits), for a user switching from MONAI's inferer.

    Args:
        inputs: (N, C, D, H, W) or (C, D, H, W): a NumPy array, a PyTorch CPU tensor (read in
            place through DLPack), or a float32 CUDA tensor, read in place on its GPU when the
            model runs there (the windows are gathered from it on the device; no host copy).
        model: a ``Model`` (its device and budget; its engine for these settings is kept) or a
            path to the ``.onnx`` file. The manifest's normalisation is not applied: the inputs
            are taken as the network's, as MONAI's predictor takes them.
        roi_size: the window, one size or (D, H, W); a size of 0 or less is the input's.
        overlap, mode, sigma_scale, padding_mode, cval: as MONAI's (``mode`` "gaussian" or
            "constant", ``padding_mode`` "constant" or "replicate").
        sw_batch_size: windows per network call; None: planned under the memory budget.
        device, memory_budget: as ``Model``'s (default: the model's, else "auto").
        progress: a callable ``(done, total)`` or ``True`` for a tqdm bar.

    Returns:
        float32 (N, C_out, D, H, W) (or (C_out, D, H, W)), a NumPy array, or a PyTorch tensor
        when ``inputs`` was one (on the inputs' device: the outputs are blended on the GPU and
        come back per finished plane, then go to that device).
    """
    on_cuda = _on_cuda(inputs)
    if on_cuda:
        x, torch_in = inputs, type(inputs).__module__.startswith("torch")
        if hasattr(x, "detach"):
            x = x.detach()
    else:
        x, torch_in = _host_array(inputs)
    single = x.ndim == 4
    if single:
        x = x[None]
    if x.ndim != 5:
        raise InvalidInput(
            f"expected (N, C, D, H, W) or (C, D, H, W) inputs, got shape {tuple(x.shape)}")
    roi = [r if r > 0 else s for r, s in zip(_triple(roi_size, "roi_size", int), x.shape[2:])]
    if isinstance(model, Model):
        device = device or model._options.get("device") or "auto"
        memory_budget = memory_budget or model._options.get("memory_budget")
    budget = None if memory_budget is None else str(memory_budget)
    settings = (tuple(roi), tuple(_triple(overlap, "overlap", float)), mode,
                tuple(_triple(sigma_scale, "sigma_scale", float)), padding_mode, float(cval),
                device or "auto", budget, sw_batch_size)
    if isinstance(model, Model):
        window = model._window(settings)
    else:
        window = _voxtile.Window(os.fspath(model), *settings)
    bar = _Progress(progress)
    total = len(x)
    try:
        outs = []
        for n, item in enumerate(x):
            step = None
            if bar.call is not None:
                step = (lambda d, t, n=n: bar.call(n * t + d, total * t))
            if on_cuda:
                outs.append(window.run_device(_dlpack_capsule(item), step))
            else:
                outs.append(window.run(_as_input(item), step))
    finally:
        bar.close()
    y = outs[0][np.newaxis] if len(outs) == 1 else np.stack(outs)
    if single:
        y = y[0]
    if torch_in:
        import torch
        t = torch.from_numpy(y)
        return t.to(inputs.device) if on_cuda else t
    return y


def _dlpack_capsule(x: Any) -> Any:
    """``x.__dlpack__()`` asking its producer not to synchronise (the engine waits for every
    stream of the device's context before it reads the tensor)."""
    try:
        return x.__dlpack__(stream=-1)
    except TypeError:
        return x.__dlpack__()
