"""The documentation site: it builds in strict mode, and its examples cannot drift from the API.

The build needs the docs packages (the test and docs extras) and is skipped without them; the checks of
the examples need only gpzoo: every ```python block in ``docs/`` parses, every ``gpzoo`` module and
name it imports exists, every ``gpzoo.a.b`` it uses resolves, and every ``zoo.get("name", key=...)``
names a registered model and options that model takes.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
PAGES = sorted(DOCS.rglob("*.md"))


def _python_blocks() -> list[tuple[str, str]]:
    """(``page:line``, code) of every fenced ```python block in docs/."""
    blocks = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for match in re.finditer(r"^```python[^\n]*\n(.*?)^```", text, flags=re.M | re.S):
            line = text.count("\n", 0, match.start()) + 1
            blocks.append((f"{page.relative_to(REPO)}:{line}", match.group(1)))
    return blocks


BLOCKS = _python_blocks()


def _trees() -> list[tuple[str, ast.Module]]:
    return [(where, ast.parse(code, filename=where)) for where, code in BLOCKS]


def _dotted(node: ast.AST) -> str | None:
    """``gpzoo.a.b`` for an attribute chain on the name ``gpzoo``, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id == "gpzoo":
        return ".".join(["gpzoo", *reversed(parts)])
    return None


def _resolve(dotted: str):
    """The object ``dotted`` names: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:split]))
        except ModuleNotFoundError:
            continue
        for attr in parts[split:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


def test_docs_have_python_examples():
    assert len(BLOCKS) >= 10, [where for where, _ in BLOCKS]


@pytest.mark.parametrize("where, code", BLOCKS, ids=[where for where, _ in BLOCKS])
def test_python_block_parses(where, code):
    ast.parse(code, filename=where)


def test_gpzoo_imports_in_examples_resolve():
    missing = []
    for where, tree in _trees():
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "gpzoo" and importlib.util.find_spec(alias.name) is None:
                        missing.append(f"{where}: import {alias.name}")
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "gpzoo":
                module = importlib.import_module(node.module)
                for alias in node.names:
                    if not hasattr(module, alias.name) and importlib.util.find_spec(f"{node.module}.{alias.name}") is None:
                        missing.append(f"{where}: from {node.module} import {alias.name}")
    assert not missing, missing


def test_gpzoo_names_in_examples_resolve():
    missing = []
    for where, tree in _trees():
        for node in ast.walk(tree):
            dotted = _dotted(node) if isinstance(node, ast.Attribute) else None
            if dotted is None:
                continue
            try:
                _resolve(dotted)
            except (ImportError, AttributeError):
                missing.append(f"{where}: {dotted}")
    assert not missing, missing


def test_zoo_models_and_options_in_examples_exist():
    from gpzoo import zoo

    trees = _trees()
    defined = {dec.args[0].value for _, tree in trees for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
               for dec in node.decorator_list
               if isinstance(dec, ast.Call) and getattr(dec.func, "attr", None) == "register" and dec.args
               and isinstance(dec.args[0], ast.Constant)}
    problems, checked = [], 0
    for where, tree in trees:
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "zoo"):
                continue
            if not (node.args and isinstance(node.args[0], ast.Constant)) or node.args[0].value in defined:
                continue
            name = node.args[0].value
            if name not in zoo.names():
                problems.append(f"{where}: no zoo model {name!r}")
                continue
            checked += 1
            unknown = [kw.arg for kw in node.keywords if kw.arg is not None and kw.arg not in zoo.option_names(name)]
            if unknown:
                problems.append(f"{where}: {name!r} has no option(s) {unknown}")
    assert not problems, problems
    assert checked >= 5


def test_every_page_is_in_the_nav():
    config = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    listed = set(re.findall(r":\s*([\w/.-]+\.(?:md|ipynb))\s*$", config, flags=re.M))
    pages = {str(p.relative_to(DOCS)) for p in PAGES}
    assert pages - listed == set(), "pages missing from mkdocs.yml's nav"
    generated = {f"notebooks/{p.name}" for p in (REPO / "notebooks").glob("*.ipynb")}
    assert listed - pages - generated == set(), "nav entries without a page"


@pytest.fixture(scope="module")
def built_site(tmp_path_factory):
    """The site, built once per module in strict mode: ``(returncode, output, site folder)``."""
    for module in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python", "mkdocs_jupyter"):
        if importlib.util.find_spec(module.split(".")[0]) is None or importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed (the docs extra: scripts/setup --docs)")
    site = tmp_path_factory.mktemp("docs") / "site"
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(REPO / "mkdocs.yml"),
                           "--site-dir", str(site)], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    return proc.returncode, proc.stdout[-4000:] + proc.stderr[-4000:], site


def test_site_builds_in_strict_mode(built_site):
    returncode, output, site = built_site
    assert returncode == 0, output
    pages = ["index.html", "results/index.html", "references/index.html", "models/convolutional/index.html",
             "workflows/compare/index.html", "notebooks/explore/index.html",
             *(f"api/{name}/index.html" for name in ("gpzoo", "kernels", "likelihoods", "zoo", "inference", "analysis"))]
    assert [p for p in pages if not (site / p).is_file()] == []
    api = (site / "api" / "gpzoo" / "index.html").read_text(encoding="utf-8")
    assert "gpzoo.fit" in api and "gpzoo.predict" in api and "checkpoint_dir" in api  # fit's signature, from its docstring page
    kernels = (site / "api" / "kernels" / "index.html").read_text(encoding="utf-8")
    assert "ChangePoint" in kernels and "WeightedConvolutional" in kernels
    results = (site / "results" / "index.html").read_text(encoding="utf-8")
    assert "reproduce_conv.py" in results and "<table>" in results


def _api_directives() -> dict[str, bool]:
    """``{dotted path: whether its members are rendered}`` for every ``::: path`` of the API pages."""
    found: dict[str, bool] = {}
    for page in sorted((DOCS / "api").glob("*.md")):
        text = page.read_text(encoding="utf-8")
        for match in re.finditer(r"^::: ([\w.]+)\n((?:[ \t]+.*\n)*)", text, flags=re.M):
            found[match.group(1)] = found.get(match.group(1), False) or "members: false" not in match.group(2)
    return found


def test_every_public_name_has_a_docstring_and_an_api_page():
    """Every function, class and module of ``gpzoo.__all__`` has a docstring, and the API reference
    renders it: a ``::: module.name`` directive, or one for its module with its members."""
    import gpzoo  # noqa: PLC0415

    directives = _api_directives()
    missing_doc, missing_page = [], []
    for name in gpzoo.__all__:
        if name.startswith("__"):
            continue
        obj = getattr(gpzoo, name)
        if not (getattr(obj, "__doc__", None) or "").strip():
            missing_doc.append(name)
        if inspect.ismodule(obj):
            path, module = obj.__name__, obj.__name__
        else:
            module = obj.__module__
            path = f"{module}.{obj.__qualname__}"
        if path not in directives and not directives.get(module, False):
            missing_page.append(f"gpzoo.{name} ({path})")
    assert missing_doc == [], f"public names without a docstring: {missing_doc}"
    assert missing_page == [], f"public names with no page in docs/api/: {missing_page}"


def _getting_started_blocks(language: str) -> list[str]:
    text = (DOCS / "index.md").read_text(encoding="utf-8")
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def _gpzoo_commands() -> list[list[str]]:
    """The getting-started page's ``.venv/bin/gpzoo ...`` command lines (after any ``scripts/setup &&``),
    as argument lists for this environment's ``gpzoo`` script."""
    commands = []
    for block in _getting_started_blocks("bash"):
        for line in block.splitlines():
            line = line.split("#", 1)[0].strip()
            line = re.sub(r"^scripts/setup(\s+--\w+)*\s*&&\s*", "", line)
            if line.startswith(".venv/bin/gpzoo "):
                commands.append([str(Path(sys.executable).parent / "gpzoo"), *line.split()[1:]])
    return commands


def test_getting_started_python_runs_as_written(tmp_path):
    """Every ```python block of the getting-started page, run in order as one script, exactly as a
    reader would paste it; its first fit classifies the rectangles (test error below 10 %)."""
    blocks = _getting_started_blocks("python")
    assert blocks, "the getting-started page has no Python example"
    script = tmp_path / "getting_started.py"
    script.write_text("\n".join(blocks), encoding="utf-8")
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "JAX_PLATFORMS": "cpu", "MPLBACKEND": "Agg"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    error = float(re.search(r"^test error ([0-9.]+)$", proc.stdout, flags=re.M).group(1))
    assert error < 0.1, proc.stdout
    assert re.search(r"^weighted-conv: ELBO -?[0-9.]+ \(last step, one minibatch of 100\) after 500 steps, last learning rate 0\.01$",
                     proc.stdout, flags=re.M), proc.stdout[:500]


def test_getting_started_commands_exist_and_the_quick_ones_run(tmp_path):
    """Every gpzoo command line of the getting-started page parses with the installed CLI; the quick
    ones (list) run as written. The fits run in the benchmark test below."""
    from gpzoo.analysis.cli import build_parser  # noqa: PLC0415

    commands = _gpzoo_commands()
    assert any(c[1] == "compare" for c in commands), "the page shows no gpzoo compare"
    for command in commands:
        build_parser().parse_args(command[1:])  # SystemExit (exit 2) on an unknown option or choice
        if command[1] == "list":
            proc = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
            assert proc.returncode == 0 and "Models:" in proc.stdout, proc.stderr


@pytest.mark.benchmark
def test_getting_started_commands_run_as_written(tmp_path):
    """The getting-started page's gpzoo commands, fits included, as written (in a scratch folder)."""
    for command in _gpzoo_commands():
        proc = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=1800,
                              env={**os.environ, "JAX_PLATFORMS": "cpu", "MPLBACKEND": "Agg"})
        assert proc.returncode == 0, (command, proc.stderr[-3000:])
    assert (tmp_path / "reports" / "rectangles" / "report.html").is_file()


_SITE_PROBE = """
<script>
window.addEventListener("load", () => {
  const width = window.innerWidth;
  const content = document.querySelector(".md-content").getBoundingClientRect();
  const result = {viewport: width, scrollWidth: document.documentElement.scrollWidth,
                  contentLeft: content.left, contentRight: content.right,
                  headings: document.querySelectorAll(".md-content h1, .md-content h2").length};
  const pre = document.createElement("pre");
  pre.id = "probe";
  pre.textContent = JSON.stringify(result);
  document.body.appendChild(pre);
});
</script>
"""


@pytest.mark.parametrize("page", ["index.html", "api/gpzoo/index.html"])
def test_site_pages_fit_a_1280px_screen(built_site, page, tmp_path):
    """The home page and an API page, rendered by headless Chromium at 1,280 px: no sideways scroll,
    the content column inside the window, and a screenshot that is not blank."""
    from PIL import Image  # noqa: PLC0415 - matplotlib's dependency
    from test_report_browser import BROWSER, _browser  # noqa: PLC0415 - the report's browser helpers

    if BROWSER is None:
        pytest.skip("no headless Chromium installed (Debian: apt-get install chromium)")
    returncode, output, site = built_site
    assert returncode == 0, output
    path = site / page
    probe = path.with_name("probe-" + path.name)  # beside the page, so its relative assets load
    probe.write_text(path.read_text(encoding="utf-8").replace("</body>", _SITE_PROBE + "</body>"), encoding="utf-8")
    proc = _browser("--window-size=1280,900", "--dump-dom", probe.as_uri())
    found = re.search(r'<pre id="probe">(.*?)</pre>', proc.stdout, re.S)
    assert found, f"the browser printed no measurements (exit {proc.returncode}): {proc.stderr[-500:]}"
    m = json.loads(found.group(1).replace("&quot;", '"'))
    assert m["viewport"] == 1280
    assert m["scrollWidth"] <= 1280, f"{page} scrolls sideways: {m['scrollWidth']} px of content in a 1280 px window"
    assert 0 <= m["contentLeft"] < m["contentRight"] <= 1280.5, m
    assert m["headings"] >= 1, m
    shot = tmp_path / "page.png"
    proc = _browser("--window-size=1280,900", f"--screenshot={shot}", path.as_uri())
    assert shot.is_file(), proc.stderr[-500:]
    pixels = np.asarray(Image.open(shot).convert("L"), dtype=float)
    assert pixels.shape == (900, 1280) and pixels.std() > 10, "the screenshot is blank"
