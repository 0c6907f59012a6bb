"""Save and load a fitted model (:class:`~gpzoo.inference.results.FitResult`) as JSON + ``.npz``; never pickle.

A saved model is a directory of three files, one signed manifest over the other two::

    manifest.json  format name and version, and the size and SHA-256 of every other file of the
                   model; its own ``sha256`` is that of its body (sorted, compact JSON without it)
    model.json     format name and version, gpzoo version, and every field of the FitResult (spec,
                   inducing variables, parameters, traces, diagnostics, training data, seed, ...)
                   as structured JSON
    arrays.npz     every array, by a readable name that model.json refers to

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

:func:`load` trusts nothing it reads. There is no secret key, so "signed" means content-addressed:
the manifest's own hash is checked, then every file it lists (paths inside the folder only: no
absolute path, no ``..``, no symbolic link) against its size and SHA-256, before any of them is
parsed. JSON nests at most :data:`MAX_JSON_DEPTH` deep; each array's ``.npy`` header is read and
checked against the dtype and shape ``model.json`` declares, and against the bytes the archive
holds, before its data is allocated (``allow_pickle=False``). Classes and functions come only
from :data:`ALLOWED_MODULES` (``gpzoo`` and ``numpyro.distributions``), and every field of a
rebuilt class is checked against the class's annotations. The model family is rebuilt with
:func:`~gpzoo.inference.fit.build_family`; the parameters must have the shapes it declares and be
finite, and its prediction is traced once (shapes only), so what someone who also rewrote the
manifest could change is refused at loading, not at ``predict``. ``predict`` on the loaded
result is bit-identical to the original's. Every failure is a
:class:`~gpzoo.models.errors.ModelFileError` naming the file (``.argument``: the file, or
``"FILE:FIELD"``).

Models saved before format version 3 have no manifest: they still load (``arrays.npz`` checked
against the SHA-256 in ``model.json``), with an :class:`~gpzoo.models.errors.UnverifiedModelWarning`
saying that ``model.json`` is unverified and how to re-save it signed. A ``model.json`` of
version 3 or later without its manifest is refused.

Writes are atomic per file (temporary name, then rename; ``arrays.npz`` first, then
``manifest.json``, which already names the hash of the ``model.json`` to come, and ``model.json``
last, so that its presence marks a finished save): a save cut short leaves either the previous
model or files that do not match the manifest, which :func:`load` refuses.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import functools
import hashlib
import importlib
import inspect
import json
import math
import numbers
import os
import re
import stat
import sys
import types
import typing
import warnings
import zipfile
from pathlib import Path, PurePosixPath

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
from numpyro.distributions import Distribution

from gpzoo.inference.checkpoint import atomic_write, sigint_deferred
from gpzoo.inference.fit import build_family
from gpzoo.inference.linalg import float_dtype
from gpzoo.inference.results import FitResult
from gpzoo.models.errors import InvalidArgumentError, ModelFileError, UnverifiedModelWarning, check_flag

__all__ = ["ALLOWED_MODULES", "FORMAT", "FORMAT_VERSION", "MANIFEST_FILE", "load", "save"]

FORMAT = "gpzoo-model"
#: Version of the file layout; :func:`load` refuses files with a larger one. Version 3: a
#: ``manifest.json`` lists every file with its size and SHA-256 (``model.json`` no longer holds the
#: checksum of ``arrays.npz``). Version 2: a deep kernel machine's
#: :class:`~gpzoo.models.dkm.DKMConfig` is the spec's ``architecture`` (its ``kernel`` is None);
#: version 1 stored it as the ``kernel``, and :func:`load` moves it (:func:`_upgrade_v1`).
FORMAT_VERSION = 3
#: Qualified name of the deep kernel machine's architecture class, as files store it.
_DKM_CONFIG = "gpzoo.models.dkm.DKMConfig"
MODEL_FILE, ARRAYS_FILE, MANIFEST_FILE = "model.json", "arrays.npz", "manifest.json"
#: Format name and version of ``manifest.json``.
MANIFEST_FORMAT, MANIFEST_VERSION = "gpzoo-model-manifest", 1
#: Deepest nesting of arrays and objects :func:`load` parses (saved models nest a few dozen deep).
MAX_JSON_DEPTH = 100
#: Largest ``model.json`` and ``manifest.json`` :func:`load` reads (the arrays are in ``arrays.npz``).
MAX_DOCUMENT_BYTES, MAX_MANIFEST_BYTES = 64 << 20, 1 << 20
#: Largest file listed in a manifest, and largest array :func:`load` allocates (its header is read first).
MAX_FILE_BYTES = MAX_ARRAY_BYTES = 1 << 36
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

    def fail(self, where: str, message: str) -> typing.NoReturn:
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
            return self.encode_object(value, typing.cast(typing.Any, value)._asdict(), where)
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
    """Write ``result`` to the directory ``path`` (created if needed) as ``model.json`` + ``arrays.npz``,
    signed by ``manifest.json``.

    Everything but the model family (rebuilt on loading) is stored; see the module docstring for
    the format. Returns the directory. A directory that already holds files (a saved model or
    anything else) is refused with :class:`~gpzoo.models.errors.InvalidArgumentError` naming
    ``path``, before anything is written, unless ``overwrite=True``: then its ``model.json``,
    ``arrays.npz`` and ``manifest.json`` are replaced and any other file in it is left alone. Raises
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
    document = {"format": FORMAT, "format_version": FORMAT_VERSION, "gpzoo_version": __version__, "result": stored}
    model_bytes = (_compact_lists(json.dumps(document, indent=1, ensure_ascii=False, allow_nan=False)) + "\n").encode("utf-8")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with sigint_deferred():
            # numpy's stub matches **arrays against savez's allow_pickle: bool, rejecting a valid call
            atomic_write(directory / ARRAYS_FILE, lambda fh: np.savez(fh, **encoder.arrays))  # type: ignore[arg-type]
            files = {MODEL_FILE: _file_entry(model_bytes),
                     ARRAYS_FILE: {"sha256": _sha256(directory / ARRAYS_FILE), "size": (directory / ARRAYS_FILE).stat().st_size}}
            manifest = _manifest_text(files).encode("ascii")
            atomic_write(directory / MANIFEST_FILE, lambda fh: fh.write(manifest))
            atomic_write(directory / MODEL_FILE, lambda fh: fh.write(model_bytes))  # last: a model.json marks a finished save
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


# ----------------------------------------------------------------------------- the manifest
def _canonical(body: dict) -> bytes:
    """The bytes the manifest's own ``sha256`` is taken of: its body as sorted, compact ASCII JSON."""
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode("ascii")


def _manifest_text(files: dict[str, dict]) -> str:
    body = {"format": MANIFEST_FORMAT, "manifest_version": MANIFEST_VERSION, "files": files}
    signed = {**body, "sha256": hashlib.sha256(_canonical(body)).hexdigest()}
    return json.dumps(signed, indent=1, sort_keys=True, ensure_ascii=True) + "\n"


def _file_entry(data: bytes) -> dict:
    return {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}


_HEX64 = re.compile(r"[0-9a-f]{64}")


def _read_manifest(directory: Path) -> dict | None:
    """The verified ``files`` table of ``manifest.json`` (name -> sha256, size), or None when the
    folder has none (a model saved before format version 3)."""
    path = directory / MANIFEST_FILE
    if not os.path.lexists(path):
        return None
    data = _read_bytes(path, MAX_MANIFEST_BYTES)
    manifest = _parse_json(data, path)
    version = _format_version(manifest, path, MANIFEST_FORMAT, "gpzoo model manifest", "manifest_version", MANIFEST_VERSION)
    if version > MANIFEST_VERSION:
        raise ModelFileError(path, f"manifest version {version}; this gpzoo reads up to version {MANIFEST_VERSION}: "
                                   "upgrade gpzoo", field="manifest_version")
    claimed = manifest.get("sha256")
    body = {k: v for k, v in manifest.items() if k != "sha256"}
    try:
        actual = hashlib.sha256(_canonical(body)).hexdigest()
    except (TypeError, ValueError):  # e.g. a number such as 1e999, which parses as inf: no hash matches it
        actual = None
    if claimed != actual:
        raise ModelFileError(path, "its own SHA-256 does not match its contents (edited or corrupt)", field="sha256")
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        raise ModelFileError(path, "corrupt: no table of files", field="files")
    if _manifest_text(files).encode("ascii") != data:  # every byte counts, layout included
        raise ModelFileError(path, "not in the layout gpzoo.save writes (edited or corrupt)")
    for name, entry in files.items():
        _inside(directory, name, path, f"files.{name}")
        if not (isinstance(entry, dict) and isinstance(entry.get("sha256"), str) and _HEX64.fullmatch(entry["sha256"])
                and type(entry.get("size")) is int and 0 <= entry["size"] <= MAX_FILE_BYTES):
            raise ModelFileError(path, f"corrupt entry for {name!r} (needs a SHA-256 and a size)", field=f"files.{name}")
    for required in (MODEL_FILE, ARRAYS_FILE):
        if required not in files:
            raise ModelFileError(path, f"does not list {required}", field="files")
    return files


def _inside(directory: Path, name, source: Path, field: str) -> Path:
    """``directory / name`` for a relative path ``name`` that stays inside ``directory``: no absolute
    path, no ``..``, no symbolic link on the way (file or folder); else ``ModelFileError`` naming
    ``source`` (the file that holds ``name``) and ``field``."""
    if not isinstance(name, str) or not name or "\\" in name or "\x00" in name:
        raise ModelFileError(source, f"refusing the file name {name!r}: not a relative path", field=field)
    pure = PurePosixPath(name)
    if pure.is_absolute() or re.match(r"[A-Za-z]:", name):
        raise ModelFileError(source, f"refusing the absolute path {name!r}: a saved model's files lie in its folder",
                             field=field)
    if any(part in ("..", ".", "") for part in name.split("/")):
        raise ModelFileError(source, f"refusing the path {name!r}: it leaves the model's folder or is not plain",
                             field=field)
    path = directory
    for part in pure.parts:
        path = path / part
        if path.is_symlink():
            raise ModelFileError(source, f"refusing {name!r}: {str(path)!r} is a symbolic link (a saved model's files "
                                         "are plain files in its folder)", field=field)
    return path


def _read_bytes(path: Path, limit: int) -> bytes:
    """The bytes of the regular file ``path`` (at most ``limit`` of them: more is refused unread)."""
    if path.is_symlink():
        raise ModelFileError(path, "refusing a symbolic link (a saved model's files are plain files in its folder)")
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            raise ModelFileError(path, "not a regular file")
        if info.st_size > limit:
            raise ModelFileError(path, f"too large ({info.st_size} bytes; at most {limit} are read)")
        with open(path, "rb") as fh:
            data = fh.read(info.st_size + 1)  # what stat reported (a read of `limit` bytes would allocate them)
    except FileNotFoundError:
        raise ModelFileError(path, "missing") from None
    except OSError as exc:
        raise ModelFileError(path, f"cannot be read ({exc.strerror or exc})") from None
    if len(data) > limit:
        raise ModelFileError(path, f"too large (over {limit} bytes)")
    return data


def _verify(path: Path, entry: dict, data: bytes | None = None) -> None:
    """``ModelFileError`` naming ``path`` unless its size and SHA-256 are the manifest's ``entry``
    (``data``: its bytes, already read; else the file is hashed in blocks)."""
    if data is None:
        if path.is_symlink() or not path.is_file():
            raise ModelFileError(path, f"missing or not a regular file ({MANIFEST_FILE} lists it)")
        try:
            size = path.stat().st_size
            digest = _sha256(path) if size == entry["size"] else None
        except OSError as exc:
            raise ModelFileError(path, f"cannot be read ({exc.strerror or exc})") from None
    else:
        size, digest = len(data), hashlib.sha256(data).hexdigest()
    if size != entry["size"] or digest != entry["sha256"]:
        raise ModelFileError(path, f"does not match {MANIFEST_FILE} ({'size' if size != entry['size'] else 'SHA-256'} "
                                   "differs: edited, truncated, corrupt, or left from another save)")


# ----------------------------------------------------------------------------- JSON
def _json_depth_ok(text: str, limit: int) -> bool:
    """Whether the arrays and objects of the JSON ``text`` nest at most ``limit`` deep (strings skipped)."""
    brackets = re.sub(r"[^\[\]{}]+", "", re.sub(r'"(?:[^"\\]|\\.)*"', "", text))
    depth = 0
    for char in brackets:
        depth += 1 if char in "[{" else -1
        if depth > limit:
            return False
    return True


def _no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError(f"duplicate key {next(k for k in keys if keys.count(k) > 1)!r}")
    return dict(pairs)


def _no_constant(name):
    raise ValueError(f"{name} is not JSON")


def _parse_json(data: bytes, path: Path):
    """The JSON value of ``data`` (UTF-8), nesting at most :data:`MAX_JSON_DEPTH` deep, without
    duplicate keys or NaN/Infinity literals; else ``ModelFileError`` naming ``path``."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ModelFileError(path, f"corrupt: not UTF-8 text ({exc})") from None
    if not _json_depth_ok(text, MAX_JSON_DEPTH):
        raise ModelFileError(path, f"corrupt: JSON nested more than {MAX_JSON_DEPTH} deep")
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:  # json.JSONDecodeError is a ValueError
        raise ModelFileError(path, f"corrupt or truncated ({exc or type(exc).__name__})") from None


# ----------------------------------------------------------------------------- arrays
#: dtype kinds an array of a saved model may have (no objects, no structured records).
_ARRAY_KINDS = "biufcSU"


class _Arrays:
    """The arrays of ``arrays.npz``, read one at a time by name: each header is read first and
    checked (dtype, declared shape, size within the archive and below :data:`MAX_ARRAY_BYTES`)
    before any memory is allocated for its data."""

    def __init__(self, path: Path):
        self.path = path
        self.loaded: dict[str, np.ndarray] = {}
        self.headers: dict[str, tuple] = {}
        try:
            self.zip = zipfile.ZipFile(path)
            archive_size = path.stat().st_size
            for info in self.zip.infolist():
                self._header(info, archive_size)
        except ModelFileError:
            raise
        except (zipfile.BadZipFile, ValueError, OSError, EOFError, RuntimeError, NotImplementedError) as exc:
            raise ModelFileError(path, f"corrupt ({type(exc).__name__}: {exc})") from None

    def _header(self, info: zipfile.ZipInfo, archive_size: int) -> None:
        name = info.filename[:-4] if info.filename.endswith(".npy") else None
        if name is None or name in self.headers:
            raise ModelFileError(self.path, f"unexpected or repeated member {info.filename!r}", field=info.filename)
        if info.compress_type != zipfile.ZIP_STORED or info.file_size != info.compress_size or info.file_size > archive_size:
            raise ModelFileError(self.path, f"member {info.filename!r} is compressed or claims more bytes than the "
                                            "archive holds", field=name)
        with self.zip.open(info) as fh:
            major, _ = np.lib.format.read_magic(fh)
            if major == 1:
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
            elif major == 2:
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
            else:
                raise ModelFileError(self.path, f"array {name!r} has .npy format version {major}", field=name)
            offset = fh.tell()
        if dtype.kind not in _ARRAY_KINDS or dtype.hasobject or dtype.itemsize == 0:
            raise ModelFileError(self.path, f"array {name!r} has dtype {dtype} (not a plain numeric or text array)",
                                 field=name)
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes > MAX_ARRAY_BYTES or offset + nbytes != info.file_size:
            raise ModelFileError(self.path, f"array {name!r} claims shape {shape} of {dtype} ({nbytes} bytes) but "
                                            f"its member holds {info.file_size - offset} bytes of data", field=name)
        self.headers[name] = (info, tuple(shape), dtype)

    def get(self, name, dtype, shape, fail) -> np.ndarray:
        """The array ``name`` when its header has ``dtype`` and ``shape`` (as ``model.json`` declares them)."""
        if not isinstance(name, str) or name not in self.headers:
            fail(f"{ARRAYS_FILE} has no array {name!r}")
        info, stored_shape, stored_dtype = self.headers[name]
        if not (isinstance(shape, list) and all(type(n) is int for n in shape)) or tuple(shape) != stored_shape:
            fail(f"array {name!r} is declared with shape {shape!r} but {ARRAYS_FILE} holds shape {stored_shape}")
        if not isinstance(dtype, str) or dtype != stored_dtype.str:
            fail(f"array {name!r} is declared as dtype {dtype!r} but {ARRAYS_FILE} holds {stored_dtype.str!r}")
        if name not in self.loaded:
            try:
                with self.zip.open(info) as fh:
                    self.loaded[name] = np.lib.format.read_array(fh, allow_pickle=False)
            except (zipfile.BadZipFile, ValueError, OSError, EOFError) as exc:
                raise ModelFileError(self.path, f"corrupt array {name!r} ({exc})", field=name) from None
        return self.loaded[name]

    def close(self) -> None:
        self.zip.close()


# ----------------------------------------------------------------------------- reading
class _Decoder:
    """Rebuilds values written by :class:`_Encoder`, importing only from :data:`ALLOWED_MODULES` and
    checking every field of a rebuilt class against the class's type annotations."""

    def __init__(self, path: Path, arrays: _Arrays):
        self.path = path
        self.arrays = arrays

    def fail(self, where: str, message: str) -> typing.NoReturn:
        field = f"result.{where}" if where else "result"
        raise ModelFileError(self.path, f"{message} (at {where or 'the top level'} of {MODEL_FILE})", field=field)

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
                dtype = np.dtype(value["$scalar"])
                number = value["value"]
                if dtype.kind not in "biuf" or dtype.itemsize > 8 or isinstance(number, (dict, list, str)) \
                        and not (isinstance(number, dict) and "$float" in number):
                    self.fail(where, f"malformed $scalar entry (dtype {value['$scalar']!r})")
                return dtype.type(self.decode(number, where))
            if tag == "$tuple":
                if not isinstance(value["$tuple"], list):
                    self.fail(where, "malformed $tuple entry (not a list)")
                return tuple(self.decode(v, f"{where}.{i}") for i, v in enumerate(value["$tuple"]))
            if tag == "$float":
                if value["$float"] not in ("nan", "inf", "-inf"):
                    self.fail(where, f"malformed $float entry {value['$float']!r}")
                return float(value["$float"])
            if tag == "$dict":
                pairs = value["$dict"]
                if not (isinstance(pairs, list) and all(isinstance(p, list) and len(p) == 2 for p in pairs)):
                    self.fail(where, "malformed $dict entry (not a list of pairs)")
                out = {}
                for k, v in pairs:
                    key = self.decode(k, where)
                    out[key] = self.decode(v, f"{where}.{key}")
                return out
            if tag == "$ref":
                return self.resolve(value["$ref"], where)
        except ModelFileError:
            raise
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            self.fail(where, f"malformed {tag} entry ({type(exc).__name__}: {exc})")
        self.fail(where, f"unknown tag {tag!r}")

    def decode_array(self, value, where: str):
        arr = self.arrays.get(value["$array"], value.get("dtype"), value.get("shape"), lambda msg: self.fail(where, msg))
        if not isinstance(value.get("jax", False), bool):
            self.fail(where, "malformed $array entry ('jax' is not true or false)")
        return jnp.asarray(arr) if value.get("jax") else arr

    def resolve(self, qualified: str, where: str):
        """The class or function ``module.qualname`` — only from :data:`ALLOWED_MODULES`."""
        if not isinstance(qualified, str) or not _allowed(qualified) or not _QUALIFIED.fullmatch(qualified):
            self.fail(where, f"refusing to load {qualified!r}: only classes and functions of "
                             f"{' and '.join(ALLOWED_MODULES)} are loaded")
        parts = qualified.split(".")
        for split in range(len(parts) - 1, 0, -1):  # longest importable module prefix
            module_name = ".".join(parts[:split])
            if not _allowed(module_name):
                break
            if any(part.startswith("_") and part != "__init__" for part in parts[:split]) and module_name not in sys.modules:
                continue  # private modules are imported only by the package itself
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
        if not isinstance(fields, dict) or set(value) - {"type", "fields"}:
            self.fail(where, f"the entry of {value['type']!r} is not {{'type', 'fields'}} with fields a JSON object")
        kwargs = {k: self.decode(v, f"{where}.{k}") for k, v in fields.items()}
        if dataclasses.is_dataclass(cls):
            self.check_fields(cls, kwargs, where)
        try:
            return cls(**kwargs)
        except Exception as exc:  # noqa: BLE001 - any refusal by the class is a bad file
            self.fail(where, f"cannot rebuild {value['type']} ({type(exc).__name__}: {exc})")

    def check_fields(self, cls: type, kwargs: dict, where: str) -> None:
        """Every field of ``kwargs`` conforms to ``cls``'s annotation of it (where it can be read)."""
        init = {f.name for f in dataclasses.fields(cls) if f.init}
        unknown = sorted(set(kwargs) - init)
        if unknown:
            self.fail(where, f"{cls.__name__} has no field(s) {unknown}")
        try:
            hints = typing.get_type_hints(cls)
        except Exception:  # noqa: BLE001 - an annotation this Python cannot evaluate: the class checks itself
            hints = {}
        for name, value in kwargs.items():
            if name in hints and not _conforms(value, hints[name]):
                self.fail(f"{where}.{name}", f"{cls.__name__}.{name} must be {_type_text(hints[name])}, "
                                             f"got {type(value).__name__}")


#: A dotted Python name (what ``$ref`` and ``type`` hold).
_QUALIFIED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def _conforms(value, hint) -> bool:
    """Whether ``value`` is of the annotated type ``hint``; forms not understood here pass (the
    class and the whole-model checks of :func:`load` still apply)."""
    if hint is typing.Any or hint is object:
        return True
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Annotated:
        return _conforms(value, args[0])
    if origin in (typing.Union, types.UnionType):
        return any(_conforms(value, a) for a in args)
    if hint is type(None):
        return value is None
    if origin is typing.Literal:
        return value in args
    if origin is tuple or hint is tuple:
        if not isinstance(value, (tuple, list)):
            return False
        if not args:
            return True
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_conforms(v, args[0]) for v in value)
        return len(value) == len(args) and all(_conforms(v, a) for v, a in zip(value, args))
    if origin in (list, collections.abc.Sequence) or hint is list:
        return isinstance(value, (list, tuple)) and all(_conforms(v, args[0]) for v in value) if args else \
            isinstance(value, (list, tuple))
    if origin in (dict, collections.abc.Mapping) or hint is dict:
        if not isinstance(value, dict):
            return False
        return not args or all(_conforms(k, args[0]) and _conforms(v, args[1]) for k, v in value.items())
    if origin is collections.abc.Callable or hint is collections.abc.Callable:
        return callable(value)
    if hint is bool:
        return isinstance(value, (bool, np.bool_))
    if hint is int:
        return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))
    if hint is float:
        return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))
    if hint in (np.ndarray, jax.Array):
        return isinstance(value, (np.ndarray, jax.Array))
    if isinstance(hint, type) and origin is None:
        return isinstance(value, hint)
    return True


def _type_text(hint) -> str:
    return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")


def _model_directory(path) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise ModelFileError(path, f"not a path: expected a model folder (str or os.PathLike), got {type(path).__name__}")
    directory = Path(path)
    try:
        if directory.name in (MODEL_FILE, MANIFEST_FILE) and directory.is_file() and not directory.is_symlink():
            directory = directory.parent
        if directory.is_symlink():
            raise ModelFileError(directory, f"refusing a symbolic link as a model folder (pass the folder it points "
                                            f"to, {str(directory.resolve())!r})")
        if not directory.exists():
            raise ModelFileError(directory, "no saved model there (path does not exist)")
        if not directory.is_dir():
            raise ModelFileError(directory, "not a saved gpzoo model (not a folder)")
    except (OSError, ValueError) as exc:  # e.g. a NUL byte in the name, a folder that cannot be read
        raise ModelFileError(directory, f"cannot be read ({type(exc).__name__}: {exc})") from None
    return directory


def _format_version(document, path: Path, fmt: str, what: str, key: str, newest: int) -> int:
    """The version (``document[key]``, an int >= 1) of a JSON document that must be a dict whose
    ``format`` is ``fmt`` (a ``what``); anything else is ``ModelFileError`` naming the field."""
    if not isinstance(document, dict) or document.get("format") != fmt:
        raise ModelFileError(path, f"not a {what} (format is not {fmt!r})", field="format")
    version = document.get(key)
    if type(version) is not int or version < 1:
        raise ModelFileError(path, f"corrupt: {key} {version!r}", field=key)
    return version


def _check_document(document, model_file: Path) -> dict:
    version = _format_version(document, model_file, FORMAT, "gpzoo model file", "format_version", FORMAT_VERSION)
    if version > FORMAT_VERSION:
        from gpzoo import __version__  # noqa: PLC0415

        raise ModelFileError(model_file, f"written in format version {version} by gpzoo {document.get('gpzoo_version')}; "
                                         f"this gpzoo ({__version__}) reads up to version {FORMAT_VERSION}: upgrade gpzoo",
                             field="format_version")
    if not isinstance(document.get("result"), dict):
        raise ModelFileError(model_file, "corrupt: no result", field="result")
    return document


def _read_signed(directory: Path, files: dict) -> tuple[dict, Path]:
    """The document of ``model.json`` and the path of ``arrays.npz``, every file listed in the
    manifest verified first (size and SHA-256), before anything in it is parsed."""
    model_file = _inside(directory, MODEL_FILE, directory / MANIFEST_FILE, f"files.{MODEL_FILE}")
    model_bytes = _read_bytes(model_file, MAX_DOCUMENT_BYTES)
    _verify(model_file, files[MODEL_FILE], model_bytes)
    for name, entry in files.items():
        if name != MODEL_FILE:
            _verify(_inside(directory, name, directory / MANIFEST_FILE, f"files.{name}"), entry)
    document = _check_document(_parse_json(model_bytes, model_file), model_file)
    if document["format_version"] < 3:
        raise ModelFileError(model_file, f"format version {document['format_version']} in a folder with a "
                                         f"{MANIFEST_FILE} (written by version 3 and later): corrupt", field="format_version")
    return document, directory / ARRAYS_FILE


def _read_unsigned(directory: Path) -> tuple[dict, Path]:
    """The document and arrays of a model saved before format version 3 (no manifest): ``arrays.npz``
    is checked against the SHA-256 in ``model.json``, which nothing checks; a warning says so."""
    model_file = directory / MODEL_FILE
    if not os.path.lexists(model_file):
        raise ModelFileError(directory, f"not a saved gpzoo model ({MODEL_FILE} missing)")
    model_file = _inside(directory, MODEL_FILE, directory, MODEL_FILE)
    document = _check_document(_parse_json(_read_bytes(model_file, MAX_DOCUMENT_BYTES), model_file), model_file)
    if document["format_version"] >= 3:
        raise ModelFileError(directory / MANIFEST_FILE, f"missing: {MODEL_FILE} is of format version "
                                                        f"{document['format_version']}, whose files the manifest lists "
                                                        "(a save cut short, or the manifest was removed)")
    arrays_file = _inside(directory, document.get("arrays", ARRAYS_FILE), model_file, "arrays")
    if not arrays_file.is_file():
        raise ModelFileError(arrays_file, f"missing (the model's arrays; {MODEL_FILE} refers to it)")
    if _sha256(arrays_file) != document.get("arrays_sha256"):
        raise ModelFileError(arrays_file, f"does not match {MODEL_FILE} (checksum differs: truncated, corrupt, "
                                          "or left from another save)")
    warnings.warn(f"{str(directory)!r} was saved in format version {document['format_version']} (before gpzoo signed "
                  f"every file in a {MANIFEST_FILE}): {MODEL_FILE} is unverified. Re-save it with "
                  "gpzoo.save(gpzoo.load(path), path, overwrite=True) to sign it", UnverifiedModelWarning, stacklevel=3)
    return document, arrays_file


def load(path) -> FitResult:
    """Read a model written by :func:`save` (its directory, its ``model.json`` or its ``manifest.json``);
    returns a :class:`~gpzoo.inference.results.FitResult` whose predictions equal the saved result's.

    Every file the manifest lists is checked against its size and SHA-256 before it is parsed; then
    every field is checked against the class that it rebuilds, the parameters against the shapes the
    model family declares (finite values only), and the model is traced once (shapes only, nothing
    computed) the way ``predict`` runs it. A model saved before format version 3 (no manifest) loads
    with an :class:`~gpzoo.models.errors.UnverifiedModelWarning`.

    Raises :class:`~gpzoo.models.errors.ModelFileError` naming the file (``.argument``: the file, or
    ``"FILE:FIELD"``) for a missing, edited, corrupt or inconsistent file, a path leaving the
    folder or a symbolic link, a newer format version, or a class outside :data:`ALLOWED_MODULES`.
    """
    directory = _model_directory(path)
    files = _read_manifest(directory)
    document, arrays_file = _read_unsigned(directory) if files is None else _read_signed(directory, files)
    model_file = directory / MODEL_FILE
    arrays = _Arrays(arrays_file)
    try:
        return _rebuild(document, model_file, arrays)
    finally:
        arrays.close()


def _rebuild(document: dict, model_file: Path, arrays: _Arrays) -> FitResult:
    decoder = _Decoder(model_file, arrays)
    stored = document["result"]
    if document["format_version"] < 2:
        stored = _upgrade_v1(stored)
    known = {f.name for f in dataclasses.fields(FitResult)} - set(REBUILT_FIELDS)
    unknown = sorted(set(stored) - known)
    if unknown:
        raise ModelFileError(model_file, f"FitResult has no field(s) {unknown} (written by a different gpzoo?)",
                             field="result")
    missing = sorted(f.name for f in dataclasses.fields(FitResult)
                     if f.name not in stored and f.name not in REBUILT_FIELDS and f.default is dataclasses.MISSING)
    if missing:
        raise ModelFileError(model_file, f"corrupt: no {missing[0]!r}", field=f"result.{missing[0]}")
    try:
        values = {name: decoder.decode(value, name) for name, value in stored.items()}
        decoder.check_fields(FitResult, values, "")
        _check_values(values, decoder)
        family = build_family(values["spec"], values["inducing"], values["num_latent"])
        result = FitResult(**values, family=family)
        _prepare_hyper_guide(result)
        _check_model(result, decoder)
    except ModelFileError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever the rebuilt model refuses, the file is at fault
        raise ModelFileError(model_file, f"cannot rebuild the model ({type(exc).__name__}: {_short(exc)})",
                             field="result") from None
    return result


def _short(exc: BaseException, limit: int = 300) -> str:
    text = str(exc)
    return text if len(text) <= limit else text[:limit] + " ..."


def _check_values(values: dict, decoder: _Decoder) -> None:
    """The FitResult's own fields: counts, training data and finite parameters."""
    for name, minimum in (("num_latent", 1), ("num_data", 1), ("seed", 0)):
        if values[name] < minimum:
            decoder.fail(name, f"{name} must be an integer >= {minimum}, got {values[name]}")
    if values.get("batch_size") is not None and values["batch_size"] < 1:
        decoder.fail("batch_size", f"batch_size must be None or a positive integer, got {values['batch_size']}")
    X, y = values["X_train"], values["y_train"]
    if X.ndim < 2 or y.ndim < 1 or X.shape[0] != y.shape[0] or X.shape[0] == 0:
        decoder.fail("X_train", f"training data of shapes X {X.shape} and y {y.shape} do not pair up")
    standardisation = values.get("standardisation")
    if standardisation is not None and standardisation.x_shift is not None \
            and standardisation.x_shift.shape != (X.shape[1],):
        decoder.fail("standardisation", f"the standardisation maps {standardisation.x_shift.shape[0]} features; the "
                                        f"training inputs have {X.shape[1]}")
    for name in ("objective_history", "step_size_history"):
        if values[name].ndim != 1:
            decoder.fail(name, f"{name} must be one-dimensional, got shape {values[name].shape}")
    for name, value in values["params"].items():
        if not isinstance(name, str):
            decoder.fail("params", f"parameter name {name!r} is not a string")
        arr = np.asarray(value)
        if arr.dtype.kind not in "biufc":
            decoder.fail(f"params.{name}", f"parameter {name!r} has dtype {arr.dtype}, not a number")
        if arr.dtype.kind in "fc" and not np.all(np.isfinite(arr)):
            bad = int(arr.size - np.count_nonzero(np.isfinite(arr)))
            decoder.fail(f"params.{name}", f"parameter {name!r} holds {bad} NaN/inf value(s) of {arr.size}")


def _check_model(result: FitResult, decoder: _Decoder) -> None:
    """One trace (shapes only: nothing is computed or compiled): every ``numpyro.param`` site the
    family declares (``family.parts()`` and its guide over sampled hyperparameters, if any) is in
    ``params`` with the declared shape, and ``predict``'s computation runs on two training rows
    with the loaded parameters, giving ``num_latent`` values per point. A model that cannot
    predict is refused here rather than in ``predict``."""
    from numpyro.handlers import seed, substitute, trace  # noqa: PLC0415

    family, params = result.family, result.params
    programs = [family.parts]
    guide = getattr(family, "hyper_guide", None)
    if guide is not None:
        X1, y1 = jnp.asarray(result.X_train[:1]), jnp.asarray(result.y_train[:1], float_dtype())
        programs.append(functools.partial(guide, X1, y1, result.num_data))
    X = jnp.asarray(result.X_train[:2], float_dtype())

    def traced():
        for program in programs:
            for name, site in trace(seed(program, rng_seed=0)).get_trace().items():
                if site["type"] != "param":
                    continue
                if name not in params:
                    decoder.fail("params", f"the model declares the parameter {name!r}, which the file does not hold "
                                           "(a kernel, likelihood or structure other than the one fitted?)")
                declared, stored = tuple(np.shape(site["value"])), tuple(np.shape(params[name]))
                if stored != declared:
                    decoder.fail(f"params.{name}", f"parameter {name!r} has shape {stored}; the model declares {declared}")
        key = jax.random.PRNGKey(0)
        with substitute(data=params), seed(rng_seed=key):
            return family.predictive_moments(family.parts(), X, key)

    mean = jax.eval_shape(traced)[0]
    if tuple(mean.shape) != (X.shape[0], result.num_latent):
        decoder.fail("num_latent", f"the model predicts {tuple(mean.shape)[1:]} latent values per point, "
                                   f"not num_latent = {result.num_latent}")


def _upgrade_v1(stored: dict) -> dict:
    """The stored result of a version-1 file in version 2's layout: a spec whose ``kernel`` is a
    deep kernel machine's DKMConfig gets it as its ``architecture`` and ``kernel`` None. Every other
    version-1 spec reads as it is (``architecture`` defaults to None)."""
    spec = stored.get("spec")
    fields = spec.get("fields") if isinstance(spec, dict) else None
    kernel = fields.get("kernel") if isinstance(fields, dict) else None
    if not (isinstance(spec, dict) and isinstance(fields, dict) and isinstance(kernel, dict) and kernel.get("type") == _DKM_CONFIG
            and "architecture" not in fields):
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
