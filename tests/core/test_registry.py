"""The registry: plugin validation, per-objective dispatch, result checks, look-up errors,
head merging and providers. Throwaway plugins are inline classes on a fresh manager."""

from __future__ import annotations

import pytest
import torch

import objreg
from objreg import (
    CorruptedBatch,
    HeadSpec,
    InvalidParameterError,
    ModelOutputs,
    ObjectiveInfo,
    Param,
    PluginError,
    TokenBatch,
    UnknownNameError,
    UnknownObjectiveError,
    Vocabulary,
    masks,
)
from objreg.core.registry import merge_heads
from objreg.core.types import TaskData

B, T = 3, 5
VOCAB = Vocabulary(size=30, pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4, special_ids=(0, 1, 2, 3, 4))


def token_batch() -> TokenBatch:
    ids = torch.randint(5, 30, (B, T), generator=torch.Generator().manual_seed(0))
    is_padding = torch.zeros(B, T, dtype=torch.bool)
    is_padding[1, 3:] = True
    ids[is_padding] = 0
    ids[:, 0] = 2
    doc = torch.arange(B)[:, None].expand(B, T).masked_fill(is_padding, -1)
    return TokenBatch(ids, is_padding, is_padding.clone(), doc.clone(), doc.clone(), doc.clone())


def corrupted_from(batch: TokenBatch, tag: int = 0) -> CorruptedBatch:
    return CorruptedBatch(
        batch.input_ids.clone(),
        torch.full_like(batch.input_ids, objreg.IGNORE_INDEX),
        batch.is_padding.clone(),
        masks.positions_within_documents(batch.document_ids),
        batch.document_ids.clone(),
        {"tag": torch.full((batch.batch_size,), tag)},
    )


def outputs_for(batch: CorruptedBatch) -> ModelOutputs:
    return ModelOutputs(torch.ones(batch.batch_size, batch.input_ids.shape[1], 4), None)


class Objective:
    """A complete throwaway objective; every hook it runs is appended to ``log`` as (name, hook)."""

    def __init__(self, name: str, log: list, kind: str = "pretrain", params: tuple = (), info_name: str | None = None,
                 attention: str = "bidirectional"):
        self.name, self.log, self.kind, self.params = name, log, kind, params
        self.info_name = info_name or name
        self.attention = attention

    @objreg.hookimpl
    def objreg_objective_info(self):
        return ObjectiveInfo(
            name=self.info_name, description=f"throwaway {self.name}", kind=self.kind, params=self.params,
            heads=(HeadSpec("lm", "lm"),), attention=self.attention,
        )

    @objreg.hookimpl
    def objreg_corrupt(self, batch, generator, params, vocab):
        self.log.append((self.name, "corrupt"))
        return corrupted_from(batch, tag=ord(self.name[0]))

    @objreg.hookimpl
    def objreg_attention_mask(self, batch):
        self.log.append((self.name, "attention_mask"))
        return masks.bidirectional(batch.is_padding)

    @objreg.hookimpl
    def objreg_loss(self, outputs, batch):
        self.log.append((self.name, "loss"))
        return outputs.hidden.sum(dim=(1, 2)) * ord(self.name[0])


class Task(Objective):
    def __init__(self, name: str, log: list):
        super().__init__(name, log, kind="downstream")

    @objreg.hookimpl
    def objreg_task_data(self, source, documents, tokenizer, seq_len, limit, params):
        self.log.append((self.name, "task_data"))
        return corrupted_from(token_batch())


def manager(**plugins) -> objreg.core.manager.ObjregPluginManager:
    pm = objreg.get_plugin_manager(load_entrypoints=False, builtins=False)
    for name, plugin in plugins.items():
        pm.register(plugin, name=name)
    return pm


def problems_of(pm) -> list[str]:
    with pytest.raises(PluginError) as e:
        objreg.Registry(pm)
    assert str(e.value).startswith("plugin contract broken:")
    return e.value.problems


# -- validation -----------------------------------------------------------------------------------


@pytest.mark.parametrize("missing", ["objreg_corrupt", "objreg_loss"])
def test_objective_missing_a_compute_hook(missing):
    plugin_class = type("Incomplete", (Objective,), {missing: None})
    problems = problems_of(manager(partial=plugin_class("partial", [])))
    assert problems == [
        f"plugin 'partial' (registered at run time): pretrain objective 'partial' does not implement "
        f"required hook {missing}"
    ]


@pytest.mark.parametrize("kind", ["pretrain", "downstream"])
def test_the_mask_hook_is_required_for_custom_attention_only(kind):
    plugin_class = type("NoMask", (Task if kind == "downstream" else Objective,), {"objreg_attention_mask": None})
    custom = plugin_class("custom", [])
    custom.attention = "anti-causal"  # anything but the three patterns counts as custom
    assert problems_of(manager(custom=custom)) == [
        f"plugin 'custom' (registered at run time): {kind} objective 'custom' does not implement required hook "
        f"objreg_attention_mask (it declares custom attention 'anti-causal'; the host builds only bidirectional, "
        f"causal and prefix masks)"
    ]
    declared = objreg.Registry(manager(declared=plugin_class("declared", [])))  # bidirectional: accepted
    assert declared.info("declared").attention == "bidirectional"


def test_task_missing_task_data():
    class NoData(Objective):
        pass

    problems = problems_of(manager(nodata=NoData("nodata", [], kind="downstream")))
    assert problems == [
        "plugin 'nodata' (registered at run time): downstream objective 'nodata' does not implement "
        "required hook objreg_task_data"
    ]
    # the same plugin with objreg_task_data is fine
    assert objreg.Registry(manager(ok=Task("ok", []))).tasks() == ["ok"]


def test_missing_hook_names_the_distribution():
    pm = manager()
    pm.register_plugin(type("Incomplete", (Objective,), {"objreg_loss": None})("part", []), "part", "part-dist 3.1")
    (problem,) = problems_of(pm)
    assert problem.startswith("plugin 'part' (part-dist 3.1): ") and "objreg_loss" in problem


def test_info_name_differs_from_registration_name():
    problems = problems_of(manager(registered=Objective("registered", [], info_name="declared")))
    assert problems[0] == (
        "plugin 'registered' (registered at run time): objreg_objective_info names the objective 'declared', "
        "but the plugin is registered as 'registered' (the entry-point name must equal the objective name)"
    )


class RaisingInfo(Objective):
    @objreg.hookimpl
    def objreg_objective_info(self):
        raise RuntimeError("info exploded")


class JunkInfo(Objective):
    @objreg.hookimpl
    def objreg_objective_info(self):
        return {"name": self.name}


@pytest.mark.parametrize(
    "plugin",
    [Objective("registered", [], info_name="declared"), RaisingInfo("registered", []), JunkInfo("registered", [])],
    ids=["misnamed", "raises", "junk"],
)
def test_rejected_info_is_reported_once(plugin):
    problems = problems_of(manager(registered=plugin))
    assert len(problems) == 1, problems
    assert not any("no objective name reaches it" in p for p in problems)


def test_misspelled_hook_named():
    class Typo(Objective):
        @objreg.hookimpl
        def objreg_corupt(self, batch):
            return None

    (problem,) = problems_of(manager(typo=Typo("typo", [])))
    assert "objreg_corupt" in problem and "'typo'" in problem and "registered at run time" in problem


def test_every_misspelled_hook_named_at_once():
    class TypoA:
        @objreg.hookimpl
        def objreg_corupt(self):
            pass

    class TypoB:
        @objreg.hookimpl
        def objreg_los(self):
            pass

    problems = problems_of(manager(ta=TypoA(), tb=TypoB()))
    assert any("objreg_corupt" in p for p in problems) and any("objreg_los" in p for p in problems)


def test_stray_per_objective_hook_rejected():
    class Stray:
        @objreg.hookimpl
        def objreg_loss(self, outputs, batch):
            return outputs.hidden.sum()

    problems = problems_of(manager(a=Objective("a", []), stray=Stray()))
    assert problems == [
        "plugin 'stray' (registered at run time) implements objreg_loss but no objreg_objective_info, "
        "so no objective name reaches it"
    ]


def test_non_objective_wrapper_allowed_and_runs_around_every_objective():
    calls: list = []

    class Wrapper:
        @objreg.hookimpl(wrapper=True)
        def objreg_loss(self, outputs, batch):
            calls.append(("wrapper", "before", int(batch.extras["tag"][0])))
            result = yield
            calls.append(("wrapper", "after", tuple(result.shape)))
            return result

    registry = objreg.Registry(manager(a=Objective("a", calls), b=Objective("b", calls), wrap=Wrapper()))
    for name in ("a", "b"):
        objective = registry.get(name, vocab=VOCAB)
        corrupted = objective.corrupt(token_batch(), torch.Generator())
        mask = objective.attention_mask(corrupted)
        calls.clear()
        loss = objective.loss(outputs_for(corrupted), corrupted, mask)
        assert calls == [("wrapper", "before", ord(name)), (name, "loss"), ("wrapper", "after", (B,))]
        assert torch.equal(loss, torch.full((B,), 4.0 * T * ord(name)))


def test_info_hook_raising_or_returning_junk_is_reported():
    problems = problems_of(
        manager(raises=RaisingInfo("raises", []), junk=JunkInfo("junk", []), ok=Objective("ok", []))
    )
    assert "plugin 'raises' (registered at run time): objreg_objective_info raised RuntimeError: info exploded" in problems
    assert any(p.startswith("plugin 'junk' (registered at run time): objreg_objective_info must return one ObjectiveInfo") for p in problems)
    assert not any("'ok'" in p for p in problems)  # the good plugin is not blamed


def test_several_problems_in_one_error():
    class Stray:
        @objreg.hookimpl
        def objreg_corrupt(self, batch):
            return None

    pm = manager(
        partial=type("Incomplete", (Objective,), {"objreg_attention_mask": None})("partial", [], attention="custom"),
        misnamed=Objective("misnamed", [], info_name="other"),
        stray=Stray(),
    )
    pm.register_plugin(Objective("fine", []), "fine", "fine-dist 1.0")
    pm.register_plugin(Objective("fine", []), "fine", "clash-dist 1.0")  # a load problem
    with pytest.raises(PluginError) as e:
        objreg.Registry(pm)
    problems = e.value.problems
    expected = [
        "two plugins claim the name 'fine': fine-dist 1.0 and clash-dist 1.0",
        "plugin 'partial' (registered at run time): pretrain objective 'partial' does not implement required "
        "hook objreg_attention_mask (it declares custom attention 'custom'; the host builds only bidirectional, "
        "causal and prefix masks)",
        "plugin 'stray' (registered at run time) implements objreg_corrupt but no objreg_objective_info, so no "
        "objective name reaches it",
    ]
    for problem in expected:
        assert problem in problems
    assert any(p.startswith("plugin 'misnamed'") and "'other'" in p for p in problems)
    assert not any("'fine' (" in p for p in problems)  # the first 'fine' is valid
    message = str(e.value)
    assert message.startswith("plugin contract broken:\n")
    assert message.count("\n  - ") == len(problems) >= 4
    assert all(p in message for p in problems)


# -- per-objective dispatch ---------------------------------------------------------------------


def test_dispatch_reaches_only_the_named_objective():
    log: list = []
    pm = manager(a=Objective("a", log), b=Objective("b", log))
    registry = objreg.Registry(pm)
    monitored: list = []
    pm.add_hookcall_monitoring(
        lambda hook, impls, kwargs: monitored.append((hook, sorted(i.plugin_name for i in impls))),
        lambda outcome, hook, impls, kwargs: None,
    )
    assert registry.objectives() == ["a", "b"]
    for name in ("a", "b"):
        log.clear()
        monitored.clear()
        objective = registry.get(name, vocab=VOCAB)
        corrupted = objective.corrupt(token_batch(), torch.Generator())
        assert (corrupted.extras["tag"] == ord(name)).all()
        mask = objective.attention_mask(corrupted)
        assert torch.equal(mask, masks.bidirectional(corrupted.is_padding))
        objective.loss(outputs_for(corrupted), corrupted, mask)
        assert log == [(name, "corrupt"), (name, "attention_mask"), (name, "loss")]
        called = [(hook, impls) for hook, impls in monitored if hook != "objreg_check_params"]
        assert called == [
            ("objreg_corrupt", [name]), ("objreg_attention_mask", [name]), ("objreg_loss", [name])
        ]
        assert objective.origin == "registered at run time"


def test_task_dispatch():
    log: list = []
    registry = objreg.Registry(manager(a=Objective("a", log), t=Task("t", log), u=Task("u", log)))
    task = registry.get_task("t")
    data = task.task_data(None, [], None, 16, 10)
    # A plain CorruptedBatch from the hook keeps the heads the task declares.
    assert isinstance(data, TaskData) and isinstance(data.batch, CorruptedBatch)
    assert data.heads == (HeadSpec("lm", "lm"),)
    assert log == [("t", "task_data")]
    # Roles are types: a task has no corruption, an objective no task data.
    assert isinstance(task, objreg.Task) and not hasattr(task, "corrupt") and not hasattr(task, "prepare")
    objective = registry.get("a", vocab=VOCAB)
    assert isinstance(objective, objreg.Objective) and not hasattr(objective, "task_data")


def test_corrupt_needs_a_vocabulary():
    registry = objreg.Registry(manager(a=Objective("a", [])))
    with pytest.raises(InvalidParameterError, match="needs a vocabulary"):
        registry.get("a").corrupt(token_batch(), torch.Generator())


# -- result checks --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("result", "got"),
    [(None, "NoneType"), ("tuple", "tuple"), ("token_batch", "TokenBatch")],
)
def test_corrupt_must_return_a_corrupted_batch(result, got):
    class Bad(Objective):
        @objreg.hookimpl
        def objreg_corrupt(self, batch):
            if result == "tuple":
                return tuple(corrupted_from(batch))
            if result == "token_batch":
                return batch
            return None

    registry = objreg.Registry(manager(bad=Bad("bad", [])))
    with pytest.raises(PluginError) as e:
        registry.get("bad", vocab=VOCAB).corrupt(token_batch(), torch.Generator())
    assert e.value.problems == [
        f"pretrain 'bad' (registered at run time) returned {got} instead of a CorruptedBatch from objreg_corrupt"
    ]


def test_corrupt_must_keep_the_batch_size():
    class Shrinks(Objective):
        @objreg.hookimpl
        def objreg_corrupt(self, batch):
            return corrupted_from(batch).select(slice(0, 1))

    registry = objreg.Registry(manager(shrinks=Shrinks("shrinks", [])))
    with pytest.raises(PluginError, match=rf"returned batch size 1 for an input of {B} from objreg_corrupt"):
        registry.get("shrinks", vocab=VOCAB).corrupt(token_batch(), torch.Generator())


@pytest.mark.parametrize(
    ("make", "got"),
    [
        (lambda pad: ~pad, f"({B}, {T}) torch.bool"),
        (lambda pad: masks.bidirectional(pad).float(), f"({B}, {T}, {T}) torch.float32"),
        (lambda pad: masks.bidirectional(pad)[:, :, :-1], f"({B}, {T}, {T - 1}) torch.bool"),
        (lambda pad: None, "NoneType"),
    ],
    ids=["2-d", "float", "short", "none"],
)
def test_attention_mask_shape_and_dtype_checked(make, got):
    class Bad(Objective):
        @objreg.hookimpl
        def objreg_attention_mask(self, batch):
            return make(batch.is_padding)

    registry = objreg.Registry(manager(bad=Bad("bad", [])))
    objective = registry.get("bad", vocab=VOCAB)
    corrupted = objective.corrupt(token_batch(), torch.Generator())
    with pytest.raises(PluginError) as e:
        objective.attention_mask(corrupted)
    (problem,) = e.value.problems
    assert problem == (
        f"pretrain 'bad' (registered at run time) returned {got} instead of an AttentionMask or a bool [B, T, T] = "
        f"[{B}, {T}, {T}] mask from objreg_attention_mask"
    )


@pytest.mark.parametrize(
    ("make", "got"),
    [
        (lambda h: h.sum(), "()"),
        (lambda h: h.sum(dim=2), f"({B}, {T})"),
        (lambda h: h.sum(dim=(1, 2))[:, None], f"({B}, 1)"),
        (lambda h: float(h.sum()), "float"),
    ],
    ids=["scalar", "per-token", "column", "python-float"],
)
def test_loss_must_be_per_sample(make, got):
    class Bad(Objective):
        @objreg.hookimpl
        def objreg_loss(self, outputs):
            return make(outputs.hidden)

    registry = objreg.Registry(manager(bad=Bad("bad", [])))
    objective = registry.get("bad", vocab=VOCAB)
    corrupted = objective.corrupt(token_batch(), torch.Generator())
    with pytest.raises(PluginError) as e:
        objective.loss(outputs_for(corrupted), corrupted)
    assert e.value.problems == [
        f"pretrain 'bad' (registered at run time) returned {got} instead of per-sample losses of shape [{B}] "
        f"from objreg_loss"
    ]


# -- objreg_check_params --------------------------------------------------------------------------


def test_check_params_rejects_a_bad_combination_before_any_corrupt():
    log: list = []

    class Checked(Objective):
        @objreg.hookimpl
        def objreg_check_params(self, params):
            log.append((self.name, "check", dict(params)))
            if params["low"] > params["high"]:
                raise InvalidParameterError(f"low ({params['low']}) must be at most high ({params['high']})")

    params = (Param("low", 1, "h", int), Param("high", 2, "h", int))
    registry = objreg.Registry(
        manager(a=Checked("a", log, params=params), b=Checked("b", log, params=params))
    )
    with pytest.raises(InvalidParameterError, match=r"low \(5\) must be at most high \(2\)"):
        registry.get("a", vocab=VOCAB, low="5")
    assert log == [("a", "check", {"low": 5, "high": 2})]  # coerced first; b's check did not run
    log.clear()
    objective = registry.get("a", vocab=VOCAB, low=2, high="7")
    assert dict(objective.params) == {"low": 2, "high": 7}
    assert log == [("a", "check", {"low": 2, "high": 7})]


@pytest.mark.parametrize("limit", [0, -3, 2.5, True, "10"])
def test_the_task_handle_refuses_a_bad_limit_before_the_plugin_runs(limit):
    # A third-party task whose hook never looks at its limit gets the check from the handle.
    log: list = []
    task = objreg.Registry(manager(t=Task("t", log))).get_task("t")
    with pytest.raises(objreg.InvalidParameterError, match=r"task 't': limit must be an integer of at least 1, got "):
        task.task_data(None, [], None, 16, limit)
    assert log == []
    task.task_data(None, [], None, 16, 1)
    assert log == [("t", "task_data")]


# -- get / get_task errors ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def builtins() -> objreg.Registry:
    return objreg.Registry.load(load_entrypoints=False)


OBJECTIVES = ["bart", "clm", "contrastive", "fim", "mlm", "nsp", "prefix_lm", "rtd", "sop", "span", "t5", "ul2", "wwm"]
TASKS = ["classification", "ordering", "qa", "token_classification"]


def test_builtins(builtins):
    assert builtins.objectives() == OBJECTIVES
    assert builtins.tasks() == TASKS
    for name in OBJECTIVES + TASKS:
        assert builtins.origin(name) == "objreg (built-in)"
        assert builtins.info(name).name == name


@pytest.mark.parametrize("name", TASKS)
def test_every_builtin_task_gets_the_limit_check_naming_it(builtins, name):
    with pytest.raises(InvalidParameterError, match=rf"^task '{name}': limit must be an integer of at least 1, got 0$"):
        builtins.get_task(name).task_data(None, [["One."], ["Two."]], None, 64, 0)


def test_unknown_objective_suggests_and_lists(builtins):
    with pytest.raises(UnknownObjectiveError) as e:
        builtins.get("mlmm")
    assert str(e.value) == f"unknown objective 'mlmm'. Did you mean 'mlm'? Available: {', '.join(OBJECTIVES)}."
    assert isinstance(e.value, KeyError) and e.value.available == OBJECTIVES
    with pytest.raises(UnknownObjectiveError, match=rf"^unknown objective 'zzz'\. Available: {', '.join(OBJECTIVES)}\.$"):
        builtins.get("zzz")
    with pytest.raises(UnknownObjectiveError, match=rf"unknown downstream task 'qaa'\. Did you mean 'qa'\? Available: {', '.join(TASKS)}\."):
        builtins.get_task("qaa")
    with pytest.raises(UnknownObjectiveError, match=rf"unknown objective or task 'sopp'.*Available: {', '.join(sorted(OBJECTIVES + TASKS))}\."):
        builtins.info("sopp")


def test_get_of_a_task_and_get_task_of_an_objective(builtins):
    with pytest.raises(InvalidParameterError, match=rf"^'qa' is a downstream task, not a pre-training objective; objectives: {', '.join(OBJECTIVES)}$"):
        builtins.get("qa")
    with pytest.raises(InvalidParameterError, match=rf"^'mlm' is a pre-training objective, not a downstream task; tasks: {', '.join(TASKS)}$"):
        builtins.get_task("mlm")


def test_unknown_parameter_lists_the_allowed(builtins):
    with pytest.raises(UnknownNameError) as e:
        builtins.get("mlm", mask_probb=0.2)
    message = str(e.value)
    assert message.startswith("unknown parameter of 'mlm' 'mask_probb'. Did you mean 'mask_prob'")
    names = ", ".join(sorted(p.name for p in builtins.info("mlm").params))
    assert message.endswith(f"Available: {names}.") and "mask_replace_prob" in names


def test_wrong_parameter_type(builtins):
    with pytest.raises(InvalidParameterError, match=r"^mlm: parameter 'mask_prob' must be float, got 'abc'$"):
        builtins.get("mlm", mask_prob="abc")
    with pytest.raises(InvalidParameterError, match="must lie in"):
        builtins.get("mlm", mask_prob=1.5)
    assert builtins.get("mlm", mask_prob="0.3").params["mask_prob"] == 0.3


# -- merge_heads ----------------------------------------------------------------------------------


def test_merge_heads_shares_identical_specs():
    owners = {"a": (HeadSpec("lm", "lm"), HeadSpec("cls", "classifier", 2)),
              "b": (HeadSpec("lm", "lm"), HeadSpec("span", "span")), "c": (HeadSpec("cls", "classifier", 2),)}
    assert merge_heads(owners) == [HeadSpec("lm", "lm"), HeadSpec("cls", "classifier", 2), HeadSpec("span", "span")]
    assert merge_heads({}) == []


def test_merge_heads_conflict_names_both_owners():
    owners = {"a": (HeadSpec("cls", "classifier", 2),), "b": (HeadSpec("lm", "lm"),),
              "c": (HeadSpec("cls", "classifier", 3),)}
    with pytest.raises(PluginError) as e:
        merge_heads(owners)
    (problem,) = e.value.problems
    assert problem.startswith("'a' and 'c' declare head 'cls' differently")
    assert "num_outputs=2" in problem and "num_outputs=3" in problem


# -- providers --------------------------------------------------------------------------------------


def test_unknown_corpus_lists_providers(builtins, tmp_path):
    with pytest.raises(UnknownNameError) as e:
        builtins.load_corpus("nosuchcorpus", tmp_path)
    assert str(e.value) == (
        "unknown corpus 'nosuchcorpus'. Available: DIR (save_to_disk), PATH, default, hf:NAME[:CONFIG[:SPLIT]]."
    )


def test_unknown_model_lists_providers(builtins):
    with pytest.raises(UnknownNameError) as e:
        builtins.load_model("bert-bass", VOCAB, [], {}, torch.Generator())
    assert str(e.value) == "unknown model 'bert-bass'. Did you mean 'bert-base'? Available: DIR, bert-base, default, random-init:DIR."


class ToyBackbone(torch.nn.Module):
    """The smallest :class:`objreg.Backbone`: an embedding and nothing else."""

    hidden_size, num_layers, max_positions, layer_norm_eps = 4, 1, 0, 1e-5

    def __init__(self, vocab_size: int):
        super().__init__()
        self.vocab_size = vocab_size
        self.embedding = torch.nn.Embedding(vocab_size, self.hidden_size)

    def input_embeddings(self):
        return self.embedding.weight

    def position_embeddings(self):
        return None

    def encode(self, input_ids, attention_mask, position_ids):
        return self.embedding(input_ids)


def test_provider_from_a_throwaway_plugin():
    class Toy:
        @objreg.hookimpl
        def objreg_register_models(self, register):
            register(objreg.Provider("model", "toy", "an embedding", lambda name, vocab, config, g: ToyBackbone(vocab.size)))

    registry = objreg.Registry(manager(toy=Toy()))
    model = registry.load_model("toy", VOCAB, [], {}, torch.Generator())
    assert isinstance(model.backbone, ToyBackbone) and len(model.heads) == 0
    assert [p.name for p in registry.providers("model")] == ["toy"]
    assert registry.provider_origin(registry.providers("model")[0]) == "plugin 'toy' (registered at run time)"
    with pytest.raises(UnknownNameError, match=r"Available: toy\.$"):
        registry.load_model("other", VOCAB, [], {}, torch.Generator())


def test_exact_names_then_families_then_fallbacks():
    def provider(name, **kw):
        return objreg.Provider("tokenizer", name, name, lambda model, corpus, cache: name, **kw)

    class Three:
        @objreg.hookimpl
        def objreg_register_tokenizers(self, register):
            register(provider("any", fallback=True))
            register(provider("dirs", accepts=lambda name: name.startswith("/")))
            register(provider("/exact"))

    registry = objreg.Registry(manager(three=Three()))
    assert registry.load_tokenizer("/exact", None, None) == "/exact"
    assert registry.load_tokenizer("/other", None, None) == "dirs"
    assert registry.load_tokenizer("plain", None, None) == "any"


def test_two_plugins_registering_one_name_are_both_named():
    class One:
        @objreg.hookimpl
        def objreg_register_corpora(self, register):
            register(objreg.Provider("corpus", "wiki", "one", lambda name, cache: None))

    problems = problems_of(manager(one=One(), two=One()))
    assert problems == ["plugin 'two' (registered at run time) and plugin 'one' (registered at run time) both "
                        "register the corpus 'wiki'"]


def test_registering_the_wrong_kind_is_a_contract_problem():
    class Wrong:
        @objreg.hookimpl
        def objreg_register_models(self, register):
            register(objreg.Provider("corpus", "x", "a corpus in the model hook", lambda *a: None))

    (problem,) = problems_of(manager(wrong=Wrong()))
    assert problem.startswith("plugin 'wrong' (registered at run time): objreg_register_models registered")
    assert "of kind 'model'" in problem


class Doubler(torch.nn.Module):
    """A head of a plugin's own kind that shares the backbone's embedding."""

    def __init__(self, backbone):
        super().__init__()
        self.scale = torch.nn.Linear(backbone.hidden_size, backbone.hidden_size)
        self.table = torch.nn.Parameter(torch.empty(backbone.vocab_size, backbone.hidden_size))

    def tie(self, backbone):
        self.table = backbone.input_embeddings()


def test_a_plugin_head_kind_is_built_tied_and_initialised_from_the_generator():
    class Kinds:
        @objreg.hookimpl
        def objreg_register_models(self, register):
            register(objreg.Provider("model", "toy", "toy", lambda name, vocab, config, g: ToyBackbone(vocab.size)))

        @objreg.hookimpl
        def objreg_register_heads(self, register):
            register(objreg.HeadKind("doubler", "a test kind", lambda spec, backbone: Doubler(backbone)))

    registry = objreg.Registry(manager(kinds=Kinds()))
    spec = [HeadSpec("d", "doubler")]
    with torch.random.fork_rng():
        torch.manual_seed(123)  # building heads draws nothing from the global RNG
        first = registry.load_model("toy", VOCAB, spec, {}, torch.Generator().manual_seed(0))
        torch.manual_seed(456)
        again = registry.load_model("toy", VOCAB, spec, {}, torch.Generator().manual_seed(0))
    head = first.heads["d"]
    assert head.table is first.backbone.embedding.weight  # tied: one Parameter
    names = [n for n, _ in first.named_parameters()]
    assert "heads.d.table" not in names and "backbone.embedding.weight" in names
    torch.testing.assert_close(head.scale.weight, again.heads["d"].scale.weight, rtol=0, atol=0)
    assert 0.01 < float(head.scale.weight.detach().std()) < 0.04 and float(head.scale.bias.detach().abs().max()) == 0  # BERT's init
    with pytest.raises(InvalidParameterError, match=r"unknown kind 'nope'; registered kinds: doubler"):
        registry.load_model("toy", VOCAB, [HeadSpec("n", "nope")], {}, torch.Generator())


def test_task_heads_are_sized_from_the_data():
    class Sized(Task):
        @objreg.hookimpl
        def objreg_objective_info(self):
            return ObjectiveInfo(self.name, "d", kind="downstream", heads=(HeadSpec("cls", "classifier"),))

        @objreg.hookimpl
        def objreg_task_data(self, source):
            if source == "stray":
                return TaskData(corrupted_from(token_batch()), (HeadSpec("other", "classifier", 2),))
            return TaskData(corrupted_from(token_batch()), (HeadSpec("cls", "classifier", 3),))

    task = objreg.Registry(manager(sized=Sized("sized", []))).get_task("sized")
    assert task.task_data(None, [], None, 16, 10).heads == (HeadSpec("cls", "classifier", 3),)
    with pytest.raises(PluginError, match=r"sized heads \['other'\] its ObjectiveInfo does not declare"):
        task.task_data("stray", [], None, 16, 10)


def test_loss_arguments_are_opt_in_and_runs_backbone_skips_the_pass():
    seen = {}

    class V2(Objective):
        @objreg.hookimpl
        def objreg_objective_info(self):
            return ObjectiveInfo(self.name, "d", params=(objreg.Param("scale", 2.0, "a loss option"),),
                                 runs_backbone=True)

        @objreg.hookimpl
        def objreg_loss(self, outputs, batch, params, mask, vocab):
            seen.update(hidden=outputs.hidden, mask=mask, vocab=vocab)
            return params["scale"] * outputs.model.encode(batch.input_ids, mask, batch.position_ids).sum(dim=(1, 2))

    registry = objreg.Registry(manager(v2=V2("v2", [])))
    objective = registry.get("v2", vocab=VOCAB, scale=3.0)
    corrupted = objective.corrupt(token_batch(), torch.Generator())
    model = ToyBackbone(VOCAB.size)
    losses = objective.losses(model, corrupted)
    assert seen["hidden"] is None and seen["vocab"] is VOCAB  # the host did not run the backbone
    assert torch.equal(seen["mask"], masks.bidirectional(corrupted.is_padding))
    torch.testing.assert_close(losses, 3.0 * model.encode(corrupted.input_ids, None, None).sum(dim=(1, 2)))


def test_a_path_names_a_corpus_and_a_model_and_other_types_are_refused(tmp_path):
    registry = objreg.Registry.load(load_entrypoints=False)
    (tmp_path / "c.txt").write_text("One sentence here. Another one there.\n\nA second document. It ends.")
    by_path = registry.load_corpus(tmp_path / "c.txt", tmp_path / "cache")
    assert by_path.documents == registry.load_corpus(str(tmp_path / "c.txt"), tmp_path / "cache").documents
    with pytest.raises(objreg.InvalidParameterError, match=r"a corpus is named by a string .* got int 3: pass str"):
        registry.load_corpus(3, tmp_path / "cache")
    with pytest.raises(objreg.InvalidParameterError, match=r"a tokenizer is named by a string .* got NoneType None"):
        registry.load_tokenizer(None, by_path, tmp_path / "cache")
