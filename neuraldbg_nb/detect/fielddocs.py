"""The docstrings written under a dataclass's fields, read from its source.

A setting's meaning is written once, as the docstring under its field (where an editor
shows it too); the help of the magic's and the CLI's options, the panel's tooltips and
the generated documentation read it from there.
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Field name -> the docstring under it, its lines joined into one paragraph (empty
    where a field has none). Empty where the class's source cannot be read (a frozen
    application): help without the text, never an error."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    body = ast.parse(source).body[0]
    assert isinstance(body, ast.ClassDef), f"{cls.__name__}: not a class"
    docs: dict[str, str] = {}
    for field, after in zip(body.body, [*body.body[1:], None]):
        if not (isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name)):
            continue
        text = ""
        if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) \
                and isinstance(after.value.value, str):
            text = " ".join(inspect.cleandoc(after.value.value).split())
        docs[field.target.id] = text
    return docs
