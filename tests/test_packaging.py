"""gpzoo installs as ONE package: the wheel holds only ``gpzoo/`` (models/, inference/, analysis/
become gpzoo.models, gpzoo.inference, gpzoo.analysis), works from a fresh virtual environment in a
directory with its own ``models.py`` and ``inference/``, declares every third-party package it
imports, and every paper its docstrings cite has a full reference in ``docs/references.md``."""

from __future__ import annotations

import ast
import configparser
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE_DIRS = {"models": "gpzoo/models", "inference": "gpzoo/inference", "analysis": "gpzoo/analysis", "src/gpzoo": "gpzoo"}


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def _clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")}
    return {**env, "MPLBACKEND": "Agg", "JAX_PLATFORMS": "cpu", "PYTHONNOUSERSITE": "1", **extra}


def _run(cmd, **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    assert proc.returncode == 0, f"{cmd} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


# --------------------------------------------------------------------------- the wheel


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """``pip wheel --no-deps`` of a copy of the files the build reads (the checkout stays clean:
    setuptools writes build/ and *.egg-info next to the sources). Without build isolation when the
    test environment has setuptools, else pip fetches setuptools as any install does."""
    root = tmp_path_factory.mktemp("wheel")
    src = root / "src-copy"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    for name in ("src", "models", "inference", "analysis"):
        shutil.copytree(REPO / name, src / name, ignore=ignore)
    out = root / "dist"
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(src)]
    if importlib.util.find_spec("setuptools") is not None:
        cmd.insert(4, "--no-build-isolation")
    _run(cmd, env=_clean_env(), timeout=300)
    (whl,) = out.glob("gpzoo-*.whl")
    return whl


def test_wheel_holds_only_the_gpzoo_package(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    dist_info = re.compile(r"gpzoo-[^/]+\.dist-info/")
    stray = [n for n in names if not (n.startswith("gpzoo/") or dist_info.match(n))]
    assert not stray, f"files outside gpzoo/ and the dist-info folder: {stray}"
    assert not [n for n in names if n.split("/")[0] in ("models", "inference", "analysis", "src")]
    # every module of the three folders and of src/gpzoo is in the wheel under its gpzoo.* name
    # (pyproject lists the packages by hand; a new subpackage left out of it would be missing)
    expected = {f"{prefix}/{p.relative_to(REPO / folder).as_posix()}"
                for folder, prefix in PACKAGE_DIRS.items()
                for p in (REPO / folder).rglob("*.py") if "__pycache__" not in p.parts}
    missing = sorted(expected - set(names))
    assert not missing, f"modules missing from the wheel (add their package to [tool.setuptools] packages): {missing}"


def test_the_package_is_marked_typed_in_the_wheel_and_installed(wheel):
    """PEP 561: ``gpzoo/py.typed`` ships in the wheel and is in the installed package."""
    import importlib.resources  # noqa: PLC0415

    assert "gpzoo/py.typed" in zipfile.ZipFile(wheel).namelist()
    assert importlib.resources.files("gpzoo").joinpath("py.typed").is_file()


def test_wheel_console_script_is_the_cli(wheel):
    with zipfile.ZipFile(wheel) as zf:
        (entry_points,) = [n for n in zf.namelist() if n.endswith(".dist-info/entry_points.txt")]
        parser = configparser.ConfigParser()
        parser.read_string(zf.read(entry_points).decode())
    assert parser["console_scripts"]["gpzoo"].strip() == "gpzoo.analysis.cli:main"


USER_SCRIPT = r"""
import numpy as np
import gpzoo
from gpzoo import fit, predict
from gpzoo.models import zoo

rng = np.random.default_rng(0)
X = rng.normal(size=(20, 2))
y = np.sin(X[:, 0]) + 0.1 * rng.normal(size=20)
spec = zoo.get("svgp-rbf", input_dim=2, task="regression", num_inducing=4)
res = fit(spec, X, y, steps=5, progress=False)
pred = predict(res, X[:7])
assert pred.f_mean.shape[0] == 7 and np.all(np.isfinite(pred.f_mean)) and np.all(np.isfinite(pred.f_var))
assert np.all(np.isfinite(pred.y_mean))
print("gpzoo-file", gpzoo.__file__)
print("gpzoo-version", gpzoo.__version__)
print("ok")
"""


@pytest.mark.slow
def test_wheel_installs_into_a_fresh_venv_next_to_user_modules(wheel, tmp_path):
    """The wheel goes into a new venv (``--no-deps``); a ``.pth`` appends this environment's
    site-packages *after* the venv's own, so the dependencies resolve without downloading while
    gpzoo itself comes from the wheel. The user's working directory has its own ``models.py`` and
    ``inference/`` package; gpzoo must not import them."""
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], timeout=120)
    python = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--quiet", str(wheel)],
         env=_clean_env(), timeout=120)
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    parent = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    (site / "zz_parent_environment.pth").write_text("".join(f"{p}\n" for p in parent))

    work = tmp_path / "user"
    (work / "inference").mkdir(parents=True)
    (work / "models.py").write_text('raise RuntimeError("user models.py imported")\n')
    (work / "inference" / "__init__.py").write_text('raise RuntimeError("user inference/__init__.py imported")\n')
    proc = _run([str(python), "-c", USER_SCRIPT], cwd=work, env=_clean_env(), timeout=240)
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)
    assert proc.stdout.strip().endswith("ok")
    assert Path(lines["gpzoo-file"]).resolve().is_relative_to(venv.resolve()), lines["gpzoo-file"]
    assert lines["gpzoo-version"] == _pyproject()["project"]["version"]

    gpzoo_cmd = venv / "bin" / "gpzoo"
    help_text = _run([str(gpzoo_cmd), "--help"], cwd=work, env=_clean_env(), timeout=120).stdout
    assert "compare" in help_text
    if "--version" in help_text:  # only where the CLI has the option
        version = _run([str(gpzoo_cmd), "--version"], cwd=work, env=_clean_env(), timeout=120).stdout
        assert _pyproject()["project"]["version"] in version


# --------------------------------------------------------------------------- declared dependencies


def _imported_top_level_modules() -> dict[str, set[str]]:
    """Top-level module -> files that import it (absolute imports only), over the installed code."""
    found: dict[str, set[str]] = {}
    for folder in PACKAGE_DIRS:
        for path in (REPO / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, ast.Import):
                    modules = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    modules = [node.module]
                else:
                    continue
                for module in modules:
                    found.setdefault(module.split(".")[0], set()).add(str(path.relative_to(REPO)))
    return found


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_every_third_party_import_is_a_declared_dependency():
    """Each top-level module imported by models/, inference/, analysis/ or src/gpzoo that is not
    the standard library or gpzoo itself belongs to a distribution in [project] dependencies (or
    in the extra of the optional feature that imports it)."""
    project = _pyproject()["project"]
    optional = [req for extra, reqs in project.get("optional-dependencies", {}).items() if extra != "test" for req in reqs]
    # a feature's extra (gpzoo[ray], gpzoo[notebook]) declares what that feature imports, lazily
    declared = {_normalise(re.split(r"[\s<>=!~;\[]", req, maxsplit=1)[0]) for req in [*project["dependencies"], *optional]}
    distributions = importlib.metadata.packages_distributions()
    undeclared = {}
    for module, files in sorted(_imported_top_level_modules().items()):
        if module in sys.stdlib_module_names or module in ("gpzoo", "__future__"):
            continue
        dists = {_normalise(d) for d in distributions.get(module, [module])}
        if not dists & declared:
            undeclared[module] = (sorted(dists), sorted(files))
    assert not undeclared, f"imported but not in [project] dependencies (module: (distributions, files)): {undeclared}"


# --------------------------------------------------------------------------- citations


# "Duvenaud 2014", "van der Wilk et al. 2017", "Kingma & Welling 2014", "Larochelle et al. (2007",
# "Polson, Scott & Windle (2013", "Hernández-Lobato, Hernández-Lobato & Dupont 2011", "PSW 2013",
# "Devroye\n    2009" (docstrings wrap): the first author's surname (with its particles), then
# optional co-authors or "et al.", then the year; an all-capitals abbreviation ("PSW") only
# directly before its year.
_SURNAME = r"(?:(?:van der|van|von|de|di|le) )?[A-Z][^\W\d_A-Z]+(?:[-'’][A-Z][^\W\d_A-Z]+)*"
CITATION = re.compile(
    rf"\b(?:(?P<name>{_SURNAME})"
    rf"(?:\s+et\s+al\.?|(?:,\s+{_SURNAME})*\s+(?:&|and)\s+{_SURNAME})?"
    r"|(?P<abbreviation>[A-Z]{2,5}))"
    r",?\s+\(?(?P<year>(?:19|20)\d\d)[a-z]?\b"
)
# capitalised words that precede a year without being an author
NOT_AUTHORS = {"In", "Since", "From", "Until", "The", "See", "As", "Before", "After", "Jan", "Dec", "Python",
               "GPflow", "MNIST", "CIFAR", "UAI", "ICML", "AAAI", "ICLR", "AISTATS", "NeurIPS", "CO2"}


def _docstrings(path: Path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                yield doc


def _reference_entries() -> list[str]:
    """docs/references.md as entries: each list item with its continuation lines."""
    entries, current = [], []
    for line in (REPO / "docs" / "references.md").read_text().splitlines():
        if line.startswith(("- ", "#")) or not line.strip():
            if current:
                entries.append(" ".join(current))
            current = [line] if line.startswith("- ") else []
        elif current:
            current.append(line.strip())
    if current:
        entries.append(" ".join(current))
    return entries


def test_citation_pattern_finds_the_forms_the_code_uses():
    text = ("(van der Wilk et al. 2017, eq. 19) Duvenaud 2014 Kingma & Welling 2014 Larochelle et al. (2007) "
            "Polson, Scott & Windle (2013, Thm 1) PSW 2013 §3.1 (Devroye\n    2009) Hernández-Lobato, "
            "Hernández-Lobato & Dupont 2011 (RBF, van der Wilk et al. 2018) doubly stochastic VI,\n Salimbeni & "
            "Deisenroth 2017; B_k 2017")
    found = {(m["name"] or m["abbreviation"], m["year"]) for m in CITATION.finditer(text)}
    assert found == {("van der Wilk", "2017"), ("Duvenaud", "2014"), ("Kingma", "2014"), ("Larochelle", "2007"),
                     ("Polson", "2013"), ("PSW", "2013"), ("Devroye", "2009"), ("Hernández-Lobato", "2011"),
                     ("van der Wilk", "2018"), ("Salimbeni", "2017")}


def test_every_docstring_citation_has_a_full_reference():
    """Every "Author YEAR" / "Author et al. YEAR" / "Author & Other YEAR" citation in a docstring of
    models/, inference/, analysis/ or src/gpzoo has an entry in docs/references.md that names the
    same first author and year."""
    entries = _reference_entries()
    cited: dict[tuple[str, str], set[str]] = {}
    for folder in PACKAGE_DIRS:
        for path in (REPO / folder).rglob("*.py"):
            for doc in _docstrings(path):
                for m in CITATION.finditer(doc):
                    name = m["name"] or m["abbreviation"]
                    if name not in NOT_AUTHORS:
                        cited.setdefault((name, m["year"]), set()).add(str(path.relative_to(REPO)))
    assert ("van der Wilk", "2017") in cited and ("Duvenaud", "2014") in cited  # the pattern sees the main ones
    missing = {f"{name} {year}": sorted(files) for (name, year), files in cited.items()
               if not any(name in entry and year in entry for entry in entries)}
    assert not missing, f"cited in docstrings but not in docs/references.md: {missing}"


def test_no_references_to_files_outside_the_repository():
    """Readers have only the repository: no path into a folder beside it, no DESIGN.md / STYLE.md, no
    design-note section or tracker wording (the phrases the pattern spells with character classes,
    so that this file does not match itself), and no paper cited as "the seed" (a random seed is fine)."""
    pattern = re.compile(r"\.\./shared|\bshared/|\bseeds/|DESIGN\.md|STYLE\.md|\bthe seed's\b|\bthe seed \(|\bThe seed\b"
                         r"|DESIGN [§]|(?i:\bthe [b]rief\b|\bthe [i]ssue\b)")
    skip_dirs = {".git", ".venv", "build", "reports", "__pycache__", ".pytest_cache"}
    offenders = []
    for dirpath, dirnames, filenames in os.walk(REPO):
        dirnames[:] = [d for d in dirnames if d not in skip_dirs and not d.endswith(".egg-info")]
        for filename in filenames:
            path = Path(dirpath) / filename
            rel = path.relative_to(REPO)
            if path.suffix not in (".py", ".md", ".ipynb", ".json", ".toml", "") or rel == Path("tests/test_packaging.py"):
                continue
            try:
                text = path.read_text()
            except (UnicodeDecodeError, OSError):
                continue
            offenders += [f"{rel}:{i}: {line.strip()}" for i, line in enumerate(text.splitlines(), 1) if pattern.search(line)]
    assert not offenders, "\n".join(offenders)


def test_no_absolute_path_of_a_machine_in_tracked_files():
    """No tracked file names a user's home on some machine (scripts find interpreters and folders
    themselves; results record where things live by variable, not by one machine's path)."""
    pattern = re.compile(r"(?<![\w.])(/root/|/home/[a-z_][\w-]*/|/Users/[A-Za-z][\w-]*/)")
    listed = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout")
    offenders = []
    for name in listed.stdout.splitlines():
        path = REPO / name
        if path.suffix not in (".py", ".md", ".json", ".toml", ".yml", ".yaml", ".ipynb", ".cfg", ".txt", "") or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        offenders += [f"{name}:{i}: {line.strip()[:120]}" for i, line in enumerate(text.splitlines(), 1)
                      if pattern.search(line) and name != "tests/test_packaging.py"]
    assert not offenders, "\n".join(offenders)
