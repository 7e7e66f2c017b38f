"""Training the shipped vocabulary, byte-identically: `python -m flowstd.tokenizer.train`.

The corpus is `corpus.txt` beside this module: the repository's own prose and pipelines
(README.md, docs/*.md, the examples' READMEs and pipelines, the standard .flow modules), joined
in path order. It is a frozen snapshot, so editing the docs does not change the vocabulary;
`--assemble-corpus REPO` takes a new snapshot from a source tree, and the vocabulary changes
only when someone retrains on purpose.

Training is a byte-level BPE (GPT-2's pre-tokenizer regex, no normaliser, so nothing is lost)
over the corpus's lines in file order, with the chat template's special tokens first (ids 0-7),
then the 256 byte tokens, then merges of pairs seen at least `MIN_FREQUENCY` times, up to
`VOCAB_SIZE` tokens. The `tokenizers` trainer breaks ties between equally frequent pairs by the
pair itself, and the file lists the vocabulary by id, so the same corpus gives the same bytes.

    python -m flowstd.tokenizer.train                 # retrain, write tokenizer.json beside this module
    python -m flowstd.tokenizer.train --check         # exit 1 if the shipped file differs from a retrain
    python -m flowstd.tokenizer.train --assemble-corpus .   # snapshot the corpus from this checkout first
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from flowstd.tokenizer.core import SPECIAL_TOKENS, TokenizerUnavailable, require_tokenizers

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "corpus.txt"
OUTPUT = HERE / "tokenizer.json"
VOCAB_SIZE = 3072
MIN_FREQUENCY = 2
# what a corpus snapshot is made of, relative to the repository root, in this order
CORPUS_SOURCES = ("README.md", "docs/*.md", "examples/*/README.md", "examples/*/pipeline.flow", "stdlib/flowstd/lib/*.flow")


def assemble_corpus(repository: Path) -> str:
    """The corpus text of a source tree: every file of CORPUS_SOURCES, in order, with a blank
    line between files."""
    paths: list[Path] = []
    for pattern in CORPUS_SOURCES:
        found = sorted(repository.glob(pattern))
        if not found:
            raise FileNotFoundError(f"{repository} has no {pattern}: is it a flowc source tree?")
        paths.extend(found)
    return "\n\n".join(path.read_text(encoding="utf-8").strip("\n") for path in paths) + "\n"


def train(corpus: str) -> str:
    """The `tokenizer.json` text a byte-level BPE trained on `corpus` gives (deterministic)."""
    tokenizers = require_tokenizers()
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tokenizer = tokenizers.Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=MIN_FREQUENCY,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes, seen in the corpus or not
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus.splitlines(keepends=True), trainer=trainer)
    return tokenizer.to_str(pretty=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flowstd.tokenizer.train", description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, default=CORPUS, help="the training text (default: corpus.txt beside this module)")
    parser.add_argument("--output", type=Path, default=OUTPUT, help="where to write tokenizer.json (default: beside this module)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if OUTPUT differs from a retrain")
    parser.add_argument("--assemble-corpus", type=Path, metavar="REPO", help="first rewrite CORPUS from the source tree REPO")
    args = parser.parse_args(argv)
    try:
        if args.assemble_corpus is not None:
            args.corpus.write_text(assemble_corpus(args.assemble_corpus), encoding="utf-8")
            print(f"wrote {args.corpus}")
        if not args.corpus.is_file():
            print(f"error: no corpus at {args.corpus} (take one with --assemble-corpus REPO)", file=sys.stderr)
            return 2
        trained = train(args.corpus.read_text(encoding="utf-8"))
    except (TokenizerUnavailable, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.check:
        shipped = args.output.read_text(encoding="utf-8") if args.output.is_file() else None
        if shipped != trained:
            print(f"{args.output} differs from a retrain on {args.corpus}: run `python -m flowstd.tokenizer.train`")
            return 1
        print(f"{args.output} is what {args.corpus} trains to")
        return 0
    args.output.write_text(trained, encoding="utf-8")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
