"""The documentation site's results page, rendered from ``benchmarks/results/*.json``.

The tables are those of the README's results section: both come from ``render`` in
``benchmarks/summarise.py``, so the page is never copied by hand. The site's build renders the page
itself (``docs/hooks.py`` calls :func:`results_page`); run this script to read or keep the Markdown:

    .venv/bin/python scripts/docs_results.py                        # print the page
    .venv/bin/python scripts/docs_results.py --out docs/results.md  # write it (the build uses a fresh copy)
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUMMARISE = ROOT / "benchmarks" / "summarise.py"

INTRO = """\
# Results and reproductions

Every table below is generated from `benchmarks/results/*.json` by `benchmarks/summarise.py`, the
same tables as the README's results section; this page is rendered from the JSON files each time
the site is built.

Each benchmark and reproduction is a script in `benchmarks/` that writes its JSON file; the
reproductions cite the paper and the table or figure they reproduce (full entries in
[References](references.md)). To rerun the paper reproductions:

```bash
.venv/bin/python benchmarks/reproduce_conv.py --experiment rectangles        # or mnist01, mnist10, all
.venv/bin/python benchmarks/reproduce_invariance.py --experiment rotated     # or mnist10, all
.venv/bin/python benchmarks/summarise.py                                     # rebuild the README's tables
```

`--steps`, `--max-train` and `--num-inducing` shorten or resize a run; each run records its
device, settings and whether it was reduced. The test suite runs them with
`.venv/bin/python -m pytest -m benchmark`. Runs marked **reduced** or **CPU-sized** are smaller
than the papers' and not converged: compare their rankings with the papers', not their numbers.
"""


def _summarise():
    spec = importlib.util.spec_from_file_location("_gpzoo_summarise", SUMMARISE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def results_page(results_dir: Path | None = None) -> str:
    """The page's Markdown: an introduction, then one section per results file."""
    summarise = _summarise()
    body = summarise.render(results_dir or summarise.RESULTS)
    body = re.sub(r"^### ", "## ", body, flags=re.MULTILINE)  # the README nests them one level deeper
    return INTRO + "\n" + body + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--results", type=Path, default=None, help="folder of the *.json results (default benchmarks/results)")
    parser.add_argument("--out", type=Path, default=None, help="write the page here instead of printing it")
    args = parser.parse_args(argv)
    page = results_page(args.results)
    if args.out is None:
        sys.stdout.write(page)
    else:
        args.out.write_text(page, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
