"""The README's two commands are what CI runs, they work for a newcomer (scripts/setup finds a
Python >= 3.12 on a plain machine and on a pyenv one), and the quick start's imports resolve."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
CI = (REPO / ".ci" / "run").read_text()
SETUP = REPO / "scripts" / "setup"


def _section(title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", README, flags=re.M | re.S)
    assert match, f"README has no '## {title}' section"
    return match.group(1)


def _code_blocks(text: str, language: str) -> list[str]:
    return [block.strip() for block in re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.M | re.S)]


def _two_commands() -> tuple[str, str]:
    blocks = _code_blocks(_section("Two commands"), "bash")
    assert len(blocks) == 2 and all("\n" not in b for b in blocks), f"expected two one-line commands, got {blocks}"
    main, tests = blocks
    return main, tests


def _ci_lines() -> list[str]:
    return [line.strip() for line in CI.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_readme_commands_use_the_setup_script():
    main, tests = _two_commands()
    assert main.startswith("scripts/setup && .venv/bin/gpzoo compare ")
    assert tests.startswith("scripts/setup --test && .venv/bin/python -m pytest")
    assert "python3.12" not in main + tests  # a pyenv shim on many machines; scripts/setup finds the interpreter


def test_ci_runs_the_readme_test_command_verbatim():
    _, tests = _two_commands()
    assert any(line == tests or line.startswith(tests + " || ") for line in _ci_lines()), \
        f".ci/run does not run the README's test command {tests!r}"


def test_ci_runs_the_readme_main_job_with_options_only():
    """The main job is the README's command followed by options that shorten it (and send the
    report to a temporary directory); the result parses with the CLI's own parser."""
    from gpzoo.analysis.cli import build_parser

    main, _ = _two_commands()
    (line,) = [line for line in _ci_lines() if line.startswith(main + " ")]
    extra = shlex.split(line[len(main):].split(" || ")[0])
    assert extra and extra[0].startswith("--"), extra
    options = [token for token in extra if token.startswith("-")]
    assert all(token.startswith("--") for token in options), extra
    argv = shlex.split(main.split("&&")[-1])[1:] + [token.replace("$out", "/tmp/out") for token in extra]
    args = build_parser().parse_args(argv)
    assert args.data == "rectangles" and args.models == "svgp-rbf,conv,weighted-conv"
    assert args.out != "reports/rectangles"  # CI does not write into the checkout's reports/


def test_ci_script_contract():
    assert CI.startswith("#!/usr/bin/env bash") and "set -euo pipefail" in CI
    assert re.search(r"export .*MPLBACKEND=Agg", CI) and "JAX_PLATFORMS=cpu" in CI and "PYTHONUNBUFFERED=1" in CI
    lines = _ci_lines()
    first_setup = next(i for i, line in enumerate(lines) if line.startswith("scripts/setup"))
    assert "rm -rf .venv" in lines[:first_setup], "CI must install from scratch"
    assert os.access(REPO / ".ci" / "run", os.X_OK) and os.access(SETUP, os.X_OK)


def test_quick_start_imports_resolve():
    blocks = _code_blocks(_section("Quick start"), "python")
    imports = [line for block in blocks for line in block.splitlines() if re.match(r"(from gpzoo\b|import gpzoo\b)", line)]
    assert imports, "the quick start imports nothing from gpzoo"
    assert all(line.startswith(("from gpzoo", "import gpzoo")) for line in imports)
    exec("\n".join(imports), {})


# --------------------------------------------------------------------------- scripts/setup


def _real_python() -> str:
    """This interpreter's real executable (not a venv's link), a Python >= 3.12."""
    return os.path.realpath(getattr(sys, "_base_executable", sys.executable))


def _which_python(tmp_path: Path, path_dirs: list[Path], **env) -> subprocess.CompletedProcess:
    """``scripts/setup --which-python`` with a PATH of ``path_dirs`` plus the system's tool dirs
    and a HOME without pyenv, i.e. a machine whose only Pythons are the ones we put there."""
    tools = tmp_path / "tools"
    tools.mkdir(exist_ok=True)
    for tool in ("bash", "env", "dirname", "ls", "sort", "tr", "awk", "sed", "cat"):
        found = next((Path(d) / tool for d in ("/usr/bin", "/bin") if (Path(d) / tool).exists()), None)
        if found and not (tools / tool).exists():
            (tools / tool).symlink_to(found)
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PYENV", "GPZOO_", "VIRTUAL_ENV"))}
    run_env = {**base, "HOME": str(home), "PATH": os.pathsep.join([*map(str, path_dirs), str(tools)]), **env}
    return subprocess.run(["bash", str(SETUP), "--which-python"], capture_output=True, text=True, env=run_env, timeout=60)


def test_setup_finds_python312_on_a_plain_path(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3.12").symlink_to(_real_python())
    proc = _which_python(tmp_path, [bin_dir])
    assert proc.returncode == 0, proc.stderr
    assert os.path.realpath(proc.stdout.strip()) == _real_python()


def test_setup_skips_a_pyenv_shim_without_that_version(tmp_path):
    """As on a pyenv machine: ``python3.12`` is a shim that fails, a real Python sits elsewhere."""
    shims, real = tmp_path / "shims", tmp_path / "real"
    shims.mkdir()
    real.mkdir()
    shim = shims / "python3.12"
    shim.write_text("#!/bin/sh\necho 'pyenv: python3.12: command not found' >&2\nexit 127\n")
    shim.chmod(0o755)
    (real / "python3.13").symlink_to(_real_python())
    proc = _which_python(tmp_path, [shims, real])
    assert proc.returncode == 0, proc.stderr
    assert os.path.realpath(proc.stdout.strip()) == _real_python()


def test_setup_finds_a_pyenv_version_directory(tmp_path):
    versions = tmp_path / "pyenv" / "versions" / "3.12.99" / "bin"
    versions.mkdir(parents=True)
    (versions / "python3").symlink_to(_real_python())
    proc = _which_python(tmp_path, [], PYENV_ROOT=str(tmp_path / "pyenv"))
    assert proc.returncode == 0, proc.stderr
    assert os.path.realpath(proc.stdout.strip()) == _real_python()


def test_setup_says_so_when_no_python_is_new_enough(tmp_path):
    old = tmp_path / "old"
    old.mkdir()
    fake = old / "python3"
    fake.write_text("#!/bin/sh\nexit 1\n")  # fails the version check, like a Python 3.11
    fake.chmod(0o755)
    proc = _which_python(tmp_path, [old], GPZOO_PYTHON_CANDIDATES=f"{fake} python3.12")
    assert proc.returncode != 0 and "no Python >= 3.12" in proc.stderr
    proc = _which_python(tmp_path, [], GPZOO_PYTHON=str(fake))
    assert proc.returncode != 0 and "GPZOO_PYTHON" in proc.stderr


def test_setup_rejects_unknown_options():
    proc = subprocess.run(["bash", str(SETUP), "--bogus"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "unknown option" in proc.stderr
