"""Which token plays each role, on vocabularies written out by hand: a setting wins over a literal
name, GPT-2's single token plays every role it can, released FIM names are found."""

from __future__ import annotations

from objreg.toolkit import special_tokens


class Vocab:
    def __init__(self, *tokens: str):
        self.ids = {t: i for i, t in enumerate(tokens)}

    def token_to_id(self, token: str) -> int | None:
        return self.ids.get(token)


def test_the_tokenizer_settings_come_first():
    vocab = Vocab("[CLS]", "[SEP]", "<bos>", "[PAD]", "[UNK]", "[MASK]")
    assert special_tokens.roles(vocab, {"cls_token": "<bos>"}) == {
        "cls": "<bos>", "sep": "[SEP]", "pad": "[PAD]", "unk": "[UNK]", "mask": "[MASK]"}
    assert special_tokens.roles(vocab, {"cls_token": "<absent>"})["cls"] == "[CLS]"  # a setting it lacks


def test_gpt2_endoftext_plays_every_role_but_has_no_markers():
    vocab = Vocab("<|endoftext|>", "hello")
    assert set(special_tokens.roles(vocab, {}).values()) == {"<|endoftext|>"}
    assert special_tokens.sentinels(vocab) == []
    assert special_tokens.named(vocab, {}) == {"[EOS]": "<|endoftext|>"}
    assert special_tokens.roles(Vocab("hello"), {})["cls"] is None


def test_released_fim_names_and_t5_sentinels():
    vocab = Vocab("</s>", "<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<extra_id_0>", "<extra_id_1>")
    assert special_tokens.named(vocab, {}) == {"[EOS]": "</s>", "[FIM_PREFIX]": "<fim_prefix>",
                                               "[FIM_MIDDLE]": "<fim_middle>", "[FIM_SUFFIX]": "<fim_suffix>"}
    assert special_tokens.sentinels(vocab) == ["<extra_id_0>", "<extra_id_1>"]
