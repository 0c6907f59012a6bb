"""A Griffe extension for the API pages: reST inline markup in gpzoo's docstrings, as Markdown.

The docstrings are prose with inline code. Some use reST roles (``:func:`fit```,
``:class:`~gpzoo.inference.results.FitResult```) and ``text::`` before an indented example; this
extension shows a role as inline code of its target (the last dotted part where reST would show
it, after ``~``), ``text::`` as ``text:``, whose indented block Markdown already shows as code,
and a reST simple table (columns between ``=== ===`` rules) as preformatted text, its columns kept
in line.
"""

from __future__ import annotations

import re

import griffe

_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|attr|data|obj|exc|const|ref|term):`(~?)([^`]+)`")
_LITERAL = re.compile(r"(\S)::[ \t]*$", re.MULTILINE)
_BARE_LITERAL = re.compile(r"^([ \t]*)::[ \t]*$", re.MULTILINE)


def _role(match: re.Match) -> str:
    tilde, target = match.groups()
    target = target.split("<")[-1].rstrip(">").strip() if "<" in target else target
    return f"`{target.rsplit('.', 1)[-1] if tilde else target}`"


_RULE = re.compile(r"^[ \t]*=+(?:[ \t]+=+)+[ \t]*$")


def _tables(text: str) -> str:
    """Fence every reST simple table: from a ``=== ===`` rule to the rule followed by a blank line."""
    lines, out, i = text.split("\n"), [], 0
    while i < len(lines):
        if _RULE.match(lines[i]):
            end = next((j for j in range(i + 1, len(lines)) if _RULE.match(lines[j])
                        and (j + 1 == len(lines) or not lines[j + 1].strip())), None)
            if end is not None:
                indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
                rows = [_ROLE.sub(lambda m: _role(m).strip("`").ljust(len(m.group(0))), row) for row in lines[i:end + 1]]
                out += [f"{indent}```text", *rows, f"{indent}```"]
                i = end + 1
                continue
        out.append(lines[i])
        i += 1
    return "\n".join(out)


def markdown(text: str) -> str:
    text = _tables(text)
    text = _ROLE.sub(_role, text)
    text = _LITERAL.sub(r"\1:", text)
    return _BARE_LITERAL.sub(r"\1", text)


class SphinxRoles(griffe.Extension):
    """Rewrite every docstring's reST roles and ``::`` markers when Griffe loads an object."""

    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)
