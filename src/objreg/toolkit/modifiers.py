"""The modifiers of the masking objectives (``mlm``, ``wwm``, ``span``) as parameters: the
masking policy, label smoothing, consistency regularisation, and character noise on the text.

A third-party masking objective that declares :data:`MODIFIER_PARAMS` accepts the same modifiers;
:func:`objreg.toolkit.masked_lm.masked_lm_loss` and :func:`objreg.toolkit.selection.policy_weights`
read them.
"""

from __future__ import annotations

from dataclasses import dataclass

from objreg.core.types import Param
from objreg.toolkit.selection import POLICIES

#: The modifier parameters every masking objective declares (``objreg.toolkit.modifiers.MODIFIER_PARAMS``).
MODIFIER_PARAMS: tuple[Param, ...] = (
    Param(
        "masking_policy", "uniform", "Which tokens are masked more often: uniform; entropy (probability "
        "proportional to the model's surprisal of the token; the batch needs surprisal); inverse_frequency "
        "(proportional to 1/p(token) from the corpus counts, which flattens the masking rate across "
        "frequency ranks).", str, choices=POLICIES,
    ),
    Param(
        "label_smoothing", 0.0, "Label smoothing epsilon of the masked-token cross-entropy (mass spread "
        "uniformly over the vocabulary, as torch's cross_entropy does).", float, 0.0, 1.0,
    ),
    Param(
        "consistency_weight", 0.0, "Weight of KL(p(view 1) || stop-gradient p(view 2)) between two independently "
        "masked views, at the positions masked in both; 0 switches it off (and the second view with it).",
        float, 0.0, None,
    ),
)


#: The data-level modifier: applied to the text before tokenising (:func:`char_noise`).
CHAR_NOISE_PARAM = Param(
    "char_noise", 0.0, "Share of the non-space characters hit by character noise (one of insert, delete, "
    "substitute, equally likely) before tokenising.", float, 0.0, 1.0,
)


@dataclass(frozen=True)
class Modifier:
    """A modifier of the masking objectives, for ``objreg list``.

    Attributes:
        name: Short name.
        description: One line.
        params: Its parameters.
        scope: ``"objective"``: the params are parameters of every objective that declares them
            (``objreg list`` shows which); ``"text"``: applied to the text before tokenising.
    """

    name: str
    description: str
    params: tuple[Param, ...]
    scope: str = "objective"


MODIFIERS: tuple[Modifier, ...] = (
    Modifier("masking_policy", "Which positions are masked: uniform, entropy (model surprisal) or "
             "inverse_frequency (1/p(token)).", MODIFIER_PARAMS[:1]),
    Modifier("label_smoothing", "Label smoothing epsilon on the masked-token cross-entropy.", MODIFIER_PARAMS[1:2]),
    Modifier("consistency", "KL(p(v1) || sg[p(v2)]) between two independently masked views, true stop-gradient.",
             MODIFIER_PARAMS[2:3]),
    Modifier("char_noise", "Character insert/delete/substitute noise on the text before tokenising "
             "(objreg.toolkit.noise.char_noise).", (CHAR_NOISE_PARAM,), scope="text"),
)


