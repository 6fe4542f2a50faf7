"""The Tokenizer Protocol of core: objreg's tokenizer satisfies it, and core names no tokenizer
of the toolkit above it, not even in annotations."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from objreg.core import tokenizer as core_tokenizer
from objreg.toolkit import tokenizer as toolkit_tokenizer

CORE = Path(core_tokenizer.__file__).parent
METHODS = ("encode_sentences", "encode_with_offsets", "batch_from_documents", "batch_from_texts")


def test_objreg_s_tokenizer_satisfies_the_protocol(tokenizer):
    assert isinstance(tokenizer, toolkit_tokenizer.Tokenizer)
    assert isinstance(tokenizer, core_tokenizer.Tokenizer)
    # Beyond the names isinstance checks: the same parameters, defaults and return annotations.
    for name in METHODS:
        promised = inspect.signature(getattr(core_tokenizer.Tokenizer, name))
        given = inspect.signature(getattr(toolkit_tokenizer.Tokenizer, name))
        assert [(p.name, p.default) for p in given.parameters.values()] == \
            [(p.name, p.default) for p in promised.parameters.values()], name
        assert given.return_annotation == promised.return_annotation, name


def test_an_object_without_a_method_of_the_protocol_does_not_satisfy_it(tokenizer):
    class Partial:
        vocab, name, architecture = tokenizer.vocab, "partial", "encoder"
        encode_sentences = encode_with_offsets = batch_from_documents = staticmethod(lambda *args: None)

    assert not isinstance(Partial(), core_tokenizer.Tokenizer)  # no batch_from_texts
    Partial.batch_from_texts = staticmethod(lambda *args: None)
    assert isinstance(Partial(), core_tokenizer.Tokenizer)


def test_core_names_only_core_even_in_annotations():
    named = []
    for path in sorted(CORE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                named.append((path.name, node.module))
            elif isinstance(node, ast.Import):
                named += [(path.name, alias.name) for alias in node.names]
    objreg_modules = [(file, module) for file, module in named if module.split(".")[0] == "objreg"]
    assert ("handles.py", "objreg.core.tokenizer") in objreg_modules  # the scan sees TYPE_CHECKING imports
    assert [(file, module) for file, module in objreg_modules if not module.startswith("objreg.core")] == []
