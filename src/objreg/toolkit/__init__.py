"""Reusable building blocks for objective and task authors, one concept per module.

================= ===========================================================================================
``selection``      which positions to mask: maskable tokens, whole words, policy weights, budgets
``replacement``    BERT's 80/10/10 among the selected positions
``masked_lm``      the masked-LM batch, attention and loss (``mlm``, ``wwm``, ``span``)
``modifiers``      the masking objectives' modifier parameters
``spans``          T5's span noise: counts, segmentations, noise masks, prefix lengths
``seq2seq``        the ``[source ; target]`` prefix-LM layout, its attention and loss
``segments``       splitting a row into a sentence pair (``sop``, ``nsp``, ``contrastive``)
``losses``         gathers at position lists, (smoothed) NLL, per-label NLL, stop-gradient KL, weighted means
``lengths``        span-length distributions; longest-first truncation of text pairs (``fit_lengths``)
``noise``          character noise on text
``heads``          the built-in head modules
``layers``         Transformer layers that ``vmap``, ``jvp`` and double backward go through
``tokenizer``      tokenisation into ``TokenBatch`` rows; ``wordpiece`` objreg's own WordPiece
``surprisal``      a model's surprisal of each token (the entropy masking policy)
``taskfiles``      what the task file readers share: lines, JSONL records, labels; even spacing, round robin
``classfiles``     classification files: GLUE-style TSV and JSONL records of a text (pair) and a label
``tagfiles``       token classification files: CoNLL and JSONL tagged sentences
``squadfiles``     SQuAD v1.1/v2.0 JSON: contexts, questions and answer spans
``documents``      a task's text corpus read as ``--corpus`` reads it
``hf_backbone``    a Hugging Face transformers model as objreg's backbone (encoders, decoders, encoder-decoders)
``hf_directory``   a transformers model directory: recognised, its architecture, its tokenizer
``atomic``         files written atomically (a temporary file renamed into place)
``overlap``        text shared between rows: the n-gram containment test and groups of rows that share text
``splits``         a task file split into training and held-out rows, the training text as a corpus
================= ===========================================================================================

Import the module you need: ``from objreg.toolkit import selection``.
"""
