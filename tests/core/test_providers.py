"""The provider Protocols say what the host passes: every built-in provider's ``load`` and
``accepts``, and every head kind's ``build``, takes exactly the Protocol's positional arguments."""

from __future__ import annotations

import inspect

import pytest

import objreg
from objreg.core import providers

REGISTRY = objreg.Registry.load(load_entrypoints=False)
LOADERS = {"model": providers.ModelLoader, "corpus": providers.CorpusLoader, "tokenizer": providers.TokenizerLoader}


def arity(protocol: type) -> int:
    """The positional arguments of ``protocol.__call__``, ``self`` aside."""
    parameters = list(inspect.signature(protocol.__call__).parameters.values())[1:]
    assert all(p.kind is inspect.Parameter.POSITIONAL_ONLY for p in parameters)  # any names will do
    return len(parameters)


def takes(function, count: int) -> bool:
    """Whether ``function`` accepts ``count`` positional arguments and needs no other."""
    try:
        inspect.signature(function).bind(*range(count))
    except TypeError:
        return False
    return True


def test_the_protocols_count_what_the_host_passes():
    assert {kind: arity(loader) for kind, loader in LOADERS.items()} == {"model": 4, "corpus": 2, "tokenizer": 3}
    assert arity(providers.Accepts) == 1 and arity(providers.HeadBuilder) == 2


@pytest.mark.parametrize("provider", REGISTRY.providers(), ids=lambda p: f"{p.kind}:{p.name}")
def test_every_built_in_provider_takes_its_protocol_s_arguments(provider):
    count = arity(LOADERS[provider.kind])
    assert takes(provider.load, count) and not takes(provider.load, count + 1)
    if provider.accepts is not None:
        assert takes(provider.accepts, arity(providers.Accepts))


@pytest.mark.parametrize("kind", sorted(REGISTRY.head_kinds()))
def test_every_built_in_head_kind_takes_its_protocol_s_arguments(kind):
    build = REGISTRY.head_kinds()[kind].build
    assert takes(build, arity(providers.HeadBuilder)) and not takes(build, arity(providers.HeadBuilder) + 1)
