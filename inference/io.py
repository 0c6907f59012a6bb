"""Save and load a fitted model (:class:`~gpzoo.inference.results.FitResult`) as JSON + ``.npz``; never pickle.

A saved model is a directory::

    model.json    format name and version, gpzoo version, SHA-256 of arrays.npz, and every
                  field of the FitResult (spec, inducing variables, parameters, traces,
                  diagnostics, training data, seed, ...) as structured JSON
    arrays.npz    every array, by a readable name that model.json refers to

Objects are written generically, so a new kernel, likelihood, orbit or group needs no code here:

* a dataclass (every kernel, likelihood, inducing-variable type, orbit, finite group, ``Fixed``,
  the ``ModelSpec``) is ``{"type": "<module>.<Class>", "fields": {...}}`` with its ``__init__``
  fields, and is rebuilt by calling the class with them (so the class validates what it reads);
* a NumPyro distribution used as a prior is ``{"type": ..., "fields": {...}}`` with the
  constructor arguments it keeps as attributes (``loc``, ``scale``, ``base_dist``, ...);
* a module-level function or class (a static strategy, say) is ``{"$ref": "<module>.<name>"}``;
* arrays are ``{"$array": "<name in arrays.npz>", "dtype", "shape", "jax"}`` (``jax``: rebuilt as
  a JAX array, else NumPy), NumPy scalars ``{"$scalar": dtype, "value"}``, tuples ``{"$tuple": [...]}``,
  non-finite floats ``{"$float": "nan"}``, dicts whose keys are not plain strings ``{"$dict": [[k, v], ...]}``.

:func:`load` imports a class or function only from :data:`ALLOWED_MODULES` (``gpzoo`` and
``numpyro.distributions``), reads arrays with ``allow_pickle=False``, checks the checksum, and
rebuilds the model family with :func:`~gpzoo.inference.fit.build_family`, so ``predict`` on the
loaded result is bit-identical to the original's. Every failure is a
:class:`~gpzoo.models.errors.ModelFileError` naming the path. Writes are atomic per file (temporary
name, then rename; ``arrays.npz`` first, ``model.json`` last): a save cut short leaves either the
previous model or a pair whose checksum does not match, which :func:`load` refuses.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import inspect
import json
import math
import re
import zipfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
from numpyro.distributions import Distribution

from gpzoo.inference.checkpoint import atomic_write, sigint_deferred
from gpzoo.inference.fit import build_family
from gpzoo.inference.linalg import float_dtype
from gpzoo.inference.results import FitResult
from gpzoo.models.errors import InvalidArgumentError, ModelFileError, check_flag

__all__ = ["ALLOWED_MODULES", "FORMAT", "FORMAT_VERSION", "load", "save"]

FORMAT = "gpzoo-model"
#: Version of the file layout; :func:`load` refuses files with a larger one. Version 2: a deep kernel
#: machine's :class:`~gpzoo.models.dkm.DKMConfig` is the spec's ``architecture`` (its ``kernel`` is
#: None); version 1 stored it as the ``kernel``, and :func:`load` moves it (:func:`_upgrade_v1`).
FORMAT_VERSION = 2
#: Qualified name of the deep kernel machine's architecture class, as files store it.
_DKM_CONFIG = "gpzoo.models.dkm.DKMConfig"
MODEL_FILE, ARRAYS_FILE = "model.json", "arrays.npz"
#: Module prefixes :func:`load` may import classes and functions from.
ALLOWED_MODULES = ("gpzoo", "numpyro.distributions")
#: FitResult fields that are rebuilt, not stored (the model family holds the NumPyro model and guide).
REBUILT_FIELDS = ("family",)


def _allowed(qualified: str) -> bool:
    return any(qualified == prefix or qualified.startswith(prefix + ".") for prefix in ALLOWED_MODULES)


def _qualified_name(obj) -> str:
    return f"{obj.__module__}.{obj.__qualname__}"


def _qualified_name_or_none(obj) -> str | None:
    try:
        return _qualified_name(obj)
    except AttributeError:
        return None


# ----------------------------------------------------------------------------- writing
class _Encoder:
    """Turns Python values into JSON-able structures, collecting arrays under readable names."""

    def __init__(self, path: Path):
        self.path = path
        self.arrays: dict[str, np.ndarray] = {}

    def fail(self, where: str, message: str):
        raise ModelFileError(self.path, f"cannot save {where or 'the result'}: {message}")

    def array_name(self, where: str) -> str:
        base = re.sub(r"[^A-Za-z0-9._+-]", "_", where) or "array"
        name, i = base, 1
        while name in self.arrays:
            name, i = f"{base}~{i}", i + 1
        return name

    def encode(self, value, where: str):
        if isinstance(value, np.generic):  # before the Python types: np.float64 is a float
            if value.dtype.kind in "biuf" and value.dtype.itemsize <= 8:
                return {"$scalar": value.dtype.name, "value": self.encode(value.item(), where)}
            return self.encode_array(value, where)
        if value is None or isinstance(value, (bool, str, int)):
            return value
        if isinstance(value, float):
            return value if math.isfinite(value) else {"$float": repr(value)}
        if isinstance(value, (np.ndarray, jax.Array)):
            return self.encode_array(value, where)
        if isinstance(value, tuple) and not hasattr(value, "_fields"):
            return {"$tuple": [self.encode(v, f"{where}.{i}") for i, v in enumerate(value)]}
        if isinstance(value, list):
            return [self.encode(v, f"{where}.{i}") for i, v in enumerate(value)]
        if isinstance(value, dict):
            return self.encode_dict(value, where)
        if isinstance(value, Distribution):
            return self.encode_object(value, _distribution_args(value, lambda msg: self.fail(where, msg)), where)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value) if f.init}
            return self.encode_object(value, fields, where)
        if hasattr(value, "_fields") and isinstance(value, tuple):  # a NamedTuple
            return self.encode_object(value, value._asdict(), where)
        if callable(value) and hasattr(value, "__qualname__") and hasattr(value, "__module__"):
            name = _qualified_name(value)
            if "<" in name or not _allowed(name):
                self.fail(where, f"{name} is not a module-level function or class of {' or '.join(ALLOWED_MODULES)}, "
                                 "so it could not be loaded")
            return {"$ref": name}
        self.fail(where, f"a {type(value).__name__} is not a dataclass, distribution, array, number, string, tuple, "
                         "list or dict")

    def encode_array(self, value, where: str):
        is_jax = isinstance(value, jax.Array)
        arr = np.asarray(value)
        if arr.dtype.hasobject:
            self.fail(where, "arrays of Python objects cannot be stored without pickle")
        name = self.array_name(where)
        self.arrays[name] = arr
        return {"$array": name, "dtype": arr.dtype.str, "shape": list(arr.shape), "jax": is_jax}

    def encode_dict(self, value: dict, where: str):
        plain = all(isinstance(k, str) and k != "type" and not k.startswith("$") for k in value)
        if plain:
            return {k: self.encode(v, f"{where}.{k}") for k, v in value.items()}
        return {"$dict": [[self.encode(k, where), self.encode(v, f"{where}.{k}")] for k, v in value.items()]}

    def encode_object(self, value, fields: dict, where: str):
        name = _qualified_name(type(value))
        if "<" in name or not _allowed(name):
            self.fail(where, f"{name} is not a class of {' or '.join(ALLOWED_MODULES)}, so it could not be loaded")
        return {"type": name, "fields": {k: self.encode(v, f"{where}.{k}") for k, v in fields.items()}}


def _distribution_args(d: Distribution, fail) -> dict:
    """The constructor arguments of a NumPyro distribution, read from the attributes it keeps."""
    args = {}
    for p in inspect.signature(type(d).__init__).parameters.values():
        if p.name in ("self", "validate_args") or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if hasattr(d, p.name):
            args[p.name] = getattr(d, p.name)
        elif p.default is p.empty:
            fail(f"{type(d).__name__} keeps no attribute {p.name!r} for its constructor argument")
    return args


def save(result: FitResult, path, *, overwrite: bool = False) -> Path:
    """Write ``result`` to the directory ``path`` (created if needed) as ``model.json`` + ``arrays.npz``.

    Everything but the model family (rebuilt on loading) is stored; see the module docstring for
    the format. Returns the directory. A directory that already holds files (a saved model or
    anything else) is refused with :class:`~gpzoo.models.errors.InvalidArgumentError` naming
    ``path``, before anything is written, unless ``overwrite=True``: then its ``model.json`` and
    ``arrays.npz`` are replaced and any other file in it is left alone. Raises
    :class:`~gpzoo.models.errors.ModelFileError` when a value cannot be stored loadably (e.g. a
    lambda, or a class outside :data:`ALLOWED_MODULES`) or the directory cannot be written.
    """
    from gpzoo import __version__  # noqa: PLC0415 - the top-level package imports this module lazily

    if not isinstance(result, FitResult):
        raise ModelFileError(path, f"expected a FitResult to save, got {type(result).__name__}")
    overwrite = check_flag(overwrite, "overwrite")
    directory = Path(path)
    if not overwrite and directory.is_dir() and any(directory.iterdir()):
        held = "a saved model" if (directory / MODEL_FILE).exists() else "files"
        raise InvalidArgumentError("path", f"{str(directory)!r} already holds {held}; pass overwrite=True to replace it")
    encoder = _Encoder(directory)
    stored = {f.name: encoder.encode(getattr(result, f.name), f.name)
              for f in dataclasses.fields(result) if f.name not in REBUILT_FIELDS}
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with sigint_deferred():
            atomic_write(directory / ARRAYS_FILE, lambda fh: np.savez(fh, **encoder.arrays))
            document = {"format": FORMAT, "format_version": FORMAT_VERSION, "gpzoo_version": __version__,
                        "arrays": ARRAYS_FILE, "arrays_sha256": _sha256(directory / ARRAYS_FILE), "result": stored}
            text = _compact_lists(json.dumps(document, indent=1, ensure_ascii=False, allow_nan=False)) + "\n"
            atomic_write(directory / MODEL_FILE, lambda fh: fh.write(text.encode("utf-8")))
    except OSError as exc:
        raise ModelFileError(directory, f"cannot write the model: {exc.strerror or exc}") from None
    return directory


#: A JSON list of scalars as ``json.dumps(indent=...)`` lays it out, one item a line (a string
#: value cannot hold a raw newline, so the brackets matched here are always the list's own).
_FLAT_LIST = re.compile(r"\[\n\s*([^\[\]{}]*?)\n\s*\]")


def _compact_lists(text: str) -> str:
    """``[2, 3]`` on one line instead of one item per line (shapes, small lists)."""
    return _FLAT_LIST.sub(lambda m: "[" + ", ".join(item.strip() for item in m.group(1).split(",\n")) + "]", text)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# ----------------------------------------------------------------------------- reading
class _Decoder:
    """Rebuilds values written by :class:`_Encoder`, importing only from :data:`ALLOWED_MODULES`."""

    def __init__(self, path: Path, arrays):
        self.path = path
        self.arrays = arrays

    def fail(self, where: str, message: str):
        raise ModelFileError(self.path, f"{message} (at {where or 'the top level'} of {MODEL_FILE})")

    def decode(self, value, where: str):
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if isinstance(value, list):
            return [self.decode(v, f"{where}.{i}") for i, v in enumerate(value)]
        if not isinstance(value, dict):
            self.fail(where, f"unexpected JSON value {value!r}")
        if "type" in value:
            return self.decode_object(value, where)
        tags = [k for k in value if k.startswith("$")]
        if not tags:
            return {k: self.decode(v, f"{where}.{k}") for k, v in value.items()}
        tag = tags[0]
        try:
            if tag == "$array":
                return self.decode_array(value, where)
            if tag == "$scalar":
                return np.dtype(value["$scalar"]).type(value["value"])
            if tag == "$tuple":
                return tuple(self.decode(v, f"{where}.{i}") for i, v in enumerate(value["$tuple"]))
            if tag == "$float":
                return float(value["$float"])
            if tag == "$dict":
                return {self.decode(k, where): self.decode(v, f"{where}.{k}") for k, v in value["$dict"]}
            if tag == "$ref":
                return self.resolve(value["$ref"], where)
        except (KeyError, TypeError, ValueError) as exc:
            self.fail(where, f"malformed {tag} entry ({type(exc).__name__}: {exc})")
        self.fail(where, f"unknown tag {tag!r}")

    def decode_array(self, value, where: str):
        name = value["$array"]
        if name not in self.arrays:
            self.fail(where, f"{ARRAYS_FILE} has no array {name!r}")
        arr = self.arrays[name]
        return jnp.asarray(arr) if value.get("jax") else arr

    def resolve(self, qualified: str, where: str):
        """The class or function ``module.qualname`` — only from :data:`ALLOWED_MODULES`."""
        if not isinstance(qualified, str) or not _allowed(qualified):
            self.fail(where, f"refusing to load {qualified!r}: only classes and functions of "
                             f"{' and '.join(ALLOWED_MODULES)} are loaded")
        parts = qualified.split(".")
        for split in range(len(parts) - 1, 0, -1):  # longest importable module prefix
            module_name = ".".join(parts[:split])
            if not _allowed(module_name):
                break
            try:
                obj = importlib.import_module(module_name)
            except ImportError:
                continue
            try:
                for attr in parts[split:]:
                    obj = getattr(obj, attr)
            except AttributeError:
                break
            if _qualified_name_or_none(obj) != qualified:  # an alias, e.g. a module another module imported
                self.fail(where, f"refusing to load {qualified!r}: it is not defined under that name")
            return obj
        self.fail(where, f"{qualified!r} does not exist in this gpzoo (written by a different version?)")

    def decode_object(self, value, where: str):
        cls = self.resolve(value["type"], where)
        if not isinstance(cls, type) or not (dataclasses.is_dataclass(cls) or issubclass(cls, (Distribution, tuple))):
            self.fail(where, f"{value['type']!r} is not a dataclass or distribution class")
        fields = value.get("fields", {})
        if not isinstance(fields, dict):
            self.fail(where, f"the fields of {value['type']!r} are not a JSON object")
        kwargs = {k: self.decode(v, f"{where}.{k}") for k, v in fields.items()}
        try:
            return cls(**kwargs)
        except Exception as exc:  # noqa: BLE001 - any refusal by the class is a bad file
            self.fail(where, f"cannot rebuild {value['type']} ({type(exc).__name__}: {exc})")


def _read_document(directory: Path) -> dict:
    model_file = directory / MODEL_FILE
    if not directory.exists():
        raise ModelFileError(directory, "no saved model there (path does not exist)")
    if not model_file.is_file():
        raise ModelFileError(directory, f"not a saved gpzoo model ({MODEL_FILE} missing)")
    try:
        document = json.loads(model_file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelFileError(model_file, f"corrupt or truncated ({exc})") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise ModelFileError(model_file, f"not a gpzoo model file (format is not {FORMAT!r})")
    version = document.get("format_version")
    if not isinstance(version, int) or version < 1:
        raise ModelFileError(model_file, f"corrupt: format_version {version!r}")
    if version > FORMAT_VERSION:
        from gpzoo import __version__  # noqa: PLC0415

        raise ModelFileError(model_file, f"written in format version {version} by gpzoo {document.get('gpzoo_version')}; "
                                         f"this gpzoo ({__version__}) reads up to version {FORMAT_VERSION}: upgrade gpzoo")
    if not isinstance(document.get("result"), dict):
        raise ModelFileError(model_file, "corrupt: no result")
    return document


def _read_arrays(directory: Path, document: dict) -> dict[str, np.ndarray]:
    arrays_file = directory / str(document.get("arrays", ARRAYS_FILE))
    if not arrays_file.is_file():
        raise ModelFileError(arrays_file, f"missing (the model's arrays; {MODEL_FILE} refers to it)")
    if _sha256(arrays_file) != document.get("arrays_sha256"):
        raise ModelFileError(arrays_file, f"does not match {MODEL_FILE} (checksum differs: truncated, corrupt, "
                                          "or left from another save)")
    try:
        with np.load(arrays_file, allow_pickle=False) as npz:
            return {name: npz[name] for name in npz.files}
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as exc:
        raise ModelFileError(arrays_file, f"corrupt ({exc})") from None


def load(path) -> FitResult:
    """Read a model written by :func:`save` (its directory, or its ``model.json``); returns a
    :class:`~gpzoo.inference.results.FitResult` whose predictions equal the saved result's.

    Raises :class:`~gpzoo.models.errors.ModelFileError` naming the path for a missing or corrupt
    file, a newer format version, or a class outside :data:`ALLOWED_MODULES`.
    """
    directory = Path(path)
    if directory.name == MODEL_FILE and directory.is_file():
        directory = directory.parent
    document = _read_document(directory)
    decoder = _Decoder(directory / MODEL_FILE, _read_arrays(directory, document))
    stored = document["result"]
    if document["format_version"] < 2:
        stored = _upgrade_v1(stored)
    known = {f.name for f in dataclasses.fields(FitResult)} - set(REBUILT_FIELDS)
    unknown = sorted(set(stored) - known)
    if unknown:
        raise ModelFileError(directory / MODEL_FILE, f"FitResult has no field(s) {unknown} (written by a different gpzoo?)")
    values = {name: decoder.decode(value, name) for name, value in stored.items()}
    try:
        family = build_family(values["spec"], values["inducing"], values["num_latent"])
    except KeyError as exc:
        raise ModelFileError(directory / MODEL_FILE, f"corrupt: no {exc.args[0]!r}") from None
    result = FitResult(**values, family=family)
    _prepare_hyper_guide(result)
    return result


def _upgrade_v1(stored: dict) -> dict:
    """The stored result of a version-1 file in version 2's layout: a spec whose ``kernel`` is a
    deep kernel machine's DKMConfig gets it as its ``architecture`` and ``kernel`` None. Every other
    version-1 spec reads as it is (``architecture`` defaults to None)."""
    spec = stored.get("spec")
    fields = spec.get("fields") if isinstance(spec, dict) else None
    kernel = fields.get("kernel") if isinstance(fields, dict) else None
    if not (isinstance(kernel, dict) and kernel.get("type") == _DKM_CONFIG and "architecture" not in fields):
        return stored
    return {**stored, "spec": {**spec, "fields": {**fields, "kernel": None, "architecture": kernel}}}


def _prepare_hyper_guide(result: FitResult) -> None:
    """Run the family's autoguide over sampled hyperparameters once, as SVI's init does, so that it
    knows its sites (``predict`` draws from it with the loaded parameters; the values drawn here are discarded)."""
    guide = getattr(result.family, "hyper_guide", None)
    if guide is None or getattr(guide, "prototype_trace", None) is not None:
        return
    rows = min(len(result.y_train), result.batch_size or len(result.y_train))
    X = jnp.asarray(result.X_train[:rows])
    y = jnp.asarray(result.y_train[:rows], float_dtype())
    with numpyro.handlers.block(), numpyro.handlers.seed(rng_seed=0):
        guide(X, y, result.num_data)
