"""Offline training corpus for the project's base model.

The default corpus is Jane Austen's six novels, taken from the Debian package
``r-cran-janeaustenr`` (texts public domain, package MIT). The package stores
them as R objects in a lazy-load database (``data/Rdata.rdb`` + ``Rdata.rdx``);
we read that database with the pure-Python ``rdata`` parser so R is not needed.

A narrow, coherent prose corpus is deliberate: a ~7M-parameter model trained
for an hour on CPU can learn one author's style well enough to write readable
sentences, whereas a broad mix stays unreadable (measured on this project's
CPU: a 5M model on 15 MB of mixed English was still unreadable after 5.5M
tokens, at a held-out loss of 4.4).

The second corpus, ``stdlib``, is code: the running Python's standard library,
one document per module, with whole modules held out (see ``build_stdlib_corpus``).

A third kind is already tokenized: folders of recorded answers (``shard-*.json``, written by
``python -m decoding record``), each a chat model's prompts and its own greedy answers as
token ids. One document is a prompt followed by its answer (see ``build_record_corpus``): what a
draft model for that chat model must learn to predict. Being ids in the chat model's tokenizer,
these documents are never decoded to text and re-encoded.

Documents (chapters) are joined with ``DOC_SEPARATOR``, which the tokenizer
treats as its single special token (BOS/EOS), so the model sees document
boundaries. The held-out split is the *tail* of every book (by position), so
the held-out loss measures passages the model has never trained on rather
than random paragraphs interleaved with training text.
"""

from __future__ import annotations

import gzip
import json
import re
import struct
import sysconfig
import zlib
from dataclasses import dataclass
from pathlib import Path

from ..errors import DecodingError

DOC_SEPARATOR = "<|endoftext|>"
CORPUS_HELP = ("'austen' (Debian r-cran-janeaustenr), 'stdlib' (this Python's standard library) "
               "or a .txt file / folder of them")
TRAIN_CORPUS_HELP = (CORPUS_HELP + "; or a folder of recorded answers (shard-*.json, token ids: give "
                     "--tokenizer, that of the model that wrote them), several joined by ','")
JANEAUSTENR_DATA = Path("/usr/lib/R/site-library/janeaustenr/data")
AUSTEN_BOOKS = (
    "sensesensibility",
    "prideprejudice",
    "mansfieldpark",
    "emma",
    "northangerabbey",
    "persuasion",
)
DEFAULT_HELDOUT_FRACTION = 0.03
# The code corpus: every module of the running Python's standard library, minus the parts that
# are data or tests rather than code a person wrote (codec tables, pydoc's topic dump, the
# test suites, generated build config).
STDLIB_EXCLUDED_PARTS = {"test", "tests", "idle_test", "encodings", "pydoc_data", "site-packages",
                         "dist-packages", "__pycache__", "lib2to3"}
STDLIB_EXCLUDED_PREFIXES = ("_sysconfigdata", "config-")
# Every Nth module (in sorted order) is held out whole: code is judged on files never seen.
STDLIB_HELDOUT_EVERY = 25

# Self-distill records: the shards `python -m decoding record` writes, and the separator
# that joins several record folders in one --corpus.
RECORD_SHARDS = "shard-*.json"
RECORD_FOLDER_SEPARATOR = ","

# Chapter/volume headings start a new document; they carry no prose to learn.
_HEADING = re.compile(r"^(chapter|volume)\s+([ivxlc]+|\d+)\b.*$", re.IGNORECASE)
# Gutenberg marks italics as _word_; the underscores are markup, not text.
_ITALICS = re.compile(r"_([^_]+)_")


def read_janeaustenr(data_dir: Path = JANEAUSTENR_DATA) -> dict[str, list[str]]:
    """Return ``{book: lines}`` from janeaustenr's lazy-load R database.

    The ``.rdx`` index is a gzipped R serialisation of a list whose
    ``variables`` entry maps each object name to ``(offset, length)`` in the
    ``.rdb`` file; each record there is a 4-byte big-endian uncompressed size
    followed by a zlib stream holding one serialised R object.
    """
    import rdata  # imported lazily: only the Austen corpus needs it

    if not (data_dir / "Rdata.rdx").exists():
        raise DecodingError(
            f"Austen corpus not found at {data_dir}: apt-get install r-cran-janeaustenr, "
            "or pass --corpus with a .txt file or folder"
        )
    index = rdata.conversion.convert(
        rdata.parser.parse_data(gzip.decompress((data_dir / "Rdata.rdx").read_bytes()))
    )
    rdb = (data_dir / "Rdata.rdb").read_bytes()
    books: dict[str, list[str]] = {}
    for name, (offset, length) in index["variables"].items():
        record = rdb[int(offset) : int(offset) + int(length)]
        (size,) = struct.unpack(">I", record[:4])
        payload = zlib.decompress(record[4:])
        if len(payload) != size:
            raise ValueError(f"corrupt record for {name!r} in {data_dir}")
        lines = rdata.conversion.convert(rdata.parser.parse_data(payload))
        books[str(name)] = [str(line) for line in lines]
    return books


def paragraphs_from_lines(lines: list[str]) -> list[str]:
    """Join hard-wrapped lines into paragraphs (blank lines separate them)."""
    paragraphs: list[str] = []
    current: list[str] = []
    for line in [*lines, ""]:
        line = line.strip()
        if line:
            current.append(line)
        elif current:
            paragraphs.append(" ".join(current))
            current = []
    return paragraphs


def clean_paragraph(paragraph: str) -> str:
    """Strip typographic markup and normalise whitespace."""
    paragraph = _ITALICS.sub(r"\1", paragraph)
    return re.sub(r"\s+", " ", paragraph).strip()


def book_to_documents(lines: list[str]) -> list[list[str]]:
    """Split one book into chapters (lists of cleaned paragraphs).

    Everything before the first heading is title/front matter and is dropped;
    each chapter or volume heading closes the current document.
    """
    documents: list[list[str]] = []
    current: list[str] | None = None  # None until the first heading is seen
    for paragraph in paragraphs_from_lines(lines):
        if _HEADING.match(paragraph):
            if current:
                documents.append(current)
            current = []
            continue
        if current is not None:
            text = clean_paragraph(paragraph)
            if text and not text.upper().startswith("THE END"):
                current.append(text)
    if current:
        documents.append(current)
    if not documents:  # a plain text without headings: the whole thing is one document
        documents = [[clean_paragraph(p) for p in paragraphs_from_lines(lines)]]
    return documents


def split_documents(
    documents: list[list[str]], heldout_fraction: float = DEFAULT_HELDOUT_FRACTION
) -> tuple[list[list[str]], list[list[str]]]:
    """Split one book's documents by position: the last paragraphs are held out.

    Counting characters (not paragraphs) keeps the fraction honest when
    paragraph lengths vary. The chapter that straddles the cut is split in two.
    """
    total = sum(len(p) for doc in documents for p in doc)
    budget = total * heldout_fraction
    train: list[list[str]] = [list(doc) for doc in documents]
    heldout: list[list[str]] = []
    taken = 0.0
    while train and taken < budget:
        doc = train[-1]
        tail: list[str] = []
        while doc and taken < budget:
            paragraph = doc.pop()
            tail.insert(0, paragraph)
            taken += len(paragraph)
        heldout.insert(0, tail)
        if not doc:
            train.pop()
    return train, heldout


def join_documents(documents: list[list[str]]) -> str:
    """Render documents as paragraphs separated by blank lines and DOC_SEPARATOR."""
    return DOC_SEPARATOR.join("\n\n".join(doc) + "\n" for doc in documents if doc)


def stdlib_modules(root: Path | None = None) -> list[Path]:
    """The standard library's own .py files, sorted, without tests, tables and build config."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    files = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts
        if STDLIB_EXCLUDED_PARTS.intersection(parts) or parts[0].startswith(STDLIB_EXCLUDED_PREFIXES):
            continue
        files.append(path)
    if not files:
        raise DecodingError(f"no Python standard library found at {root}")
    return files


def build_stdlib_corpus(root: Path | None = None) -> tuple[str, str]:
    """``(train_text, heldout_text)`` from the standard library: one document per module.

    Source is kept verbatim (indentation is the syntax); only whitespace at the end of a file goes.
    Whole modules are held out, so held-out text is code in a file the model never saw.
    """
    train, heldout = [], []
    for i, path in enumerate(stdlib_modules(root)):
        text = path.read_text(encoding="utf-8", errors="replace").rstrip() + "\n"
        (heldout if i % STDLIB_HELDOUT_EVERY == STDLIB_HELDOUT_EVERY - 1 else train).append(text)
    return DOC_SEPARATOR.join(train), DOC_SEPARATOR.join(heldout)


@dataclass(frozen=True)
class Record:
    """One recorded answer: a chat prompt and the model's own greedy answer, as token ids."""

    prompt: list[int]
    answer: list[int]

    @property
    def ids(self) -> list[int]:
        """The record as one training document: the prompt, then the answer."""
        return self.prompt + self.answer


def record_folders(source: str) -> list[Path] | None:
    """The folders of recorded answers `source` names (one, or several joined by ','), or
    None when it names none (so it is a text corpus). A mix of record folders and other things
    is an error."""
    paths = [Path(part) for part in source.split(RECORD_FOLDER_SEPARATOR) if part]
    is_records = [path.is_dir() and any(path.glob(RECORD_SHARDS)) for path in paths]
    if not any(is_records):
        return None
    if not all(is_records):
        others = [str(p) for p, r in zip(paths, is_records, strict=True) if not r]
        raise DecodingError(f"--corpus {source}: {', '.join(others)} holds no recorded answers ({RECORD_SHARDS})")
    return paths


def read_records(folders: list[Path]) -> list[Record]:
    """Every record of every shard in these folders, folder by folder, shard by shard, in order."""
    records = []
    for folder in folders:
        for shard in sorted(folder.glob(RECORD_SHARDS)):
            meta = json.loads(shard.read_text(encoding="utf-8"))
            records += [Record(list(p), list(a)) for p, a in zip(meta["prompts"], meta["answers"], strict=True)]
    return records


def is_heldout_record(record: Record, heldout_fraction: float) -> bool:
    """Whether a record is held out: decided by a hash of its prompt, so the split is the same on
    every run and machine, and a prompt answered twice (in two folders) is never on both sides."""
    digest = zlib.crc32(json.dumps(record.prompt).encode())
    return digest % 10_000 < heldout_fraction * 10_000


def split_records(
    folders: list[Path], heldout_fraction: float = DEFAULT_HELDOUT_FRACTION
) -> tuple[list[Record], list[Record]]:
    """``(train, heldout)`` records of these folders; about `heldout_fraction` of them held out."""
    train, heldout = [], []
    for record in read_records(folders):
        (heldout if is_heldout_record(record, heldout_fraction) else train).append(record)
    if not train:
        raise DecodingError(f"no training records in {', '.join(map(str, folders))}")
    return train, heldout


def build_record_corpus(
    folders: list[Path], heldout_fraction: float = DEFAULT_HELDOUT_FRACTION
) -> tuple[list[list[int]], list[list[int]]]:
    """``(train_documents, heldout_documents)``: each a record's prompt ids followed by its answer ids."""
    train, heldout = split_records(folders, heldout_fraction)
    return [r.ids for r in train], [r.ids for r in heldout]


def build_corpus(
    source: str = "austen", heldout_fraction: float = DEFAULT_HELDOUT_FRACTION
) -> tuple[str, str]:
    """Return ``(train_text, heldout_text)`` for ``source``.

    ``source`` is ``"austen"``, ``"stdlib"`` (Python's standard library, a code
    corpus) or a path to a ``.txt`` file or a folder of them (each file treated
    like one book: chapters if it has headings, else one document).
    """
    if source == "stdlib":
        return build_stdlib_corpus()
    if record_folders(source):
        raise DecodingError(f"--corpus {source}: recorded answers are token ids, not text")
    if source == "austen":
        all_books = read_janeaustenr()
        books = [all_books[name] for name in AUSTEN_BOOKS]
    else:
        path = Path(source)
        files = sorted(path.glob("**/*.txt")) if path.is_dir() else [path]
        if not files or not all(f.is_file() for f in files):
            raise DecodingError(f"--corpus {source}: not 'austen', 'stdlib', a .txt file or a folder of them")
        books = [f.read_text(encoding="utf-8").splitlines() for f in files]
    train_docs: list[list[str]] = []
    heldout_docs: list[list[str]] = []
    for lines in books:
        train, heldout = split_documents(book_to_documents(lines), heldout_fraction)
        train_docs += train
        heldout_docs += heldout
    return join_documents(train_docs), join_documents(heldout_docs)


def write_corpus(out_dir: Path, source: str = "austen") -> tuple[Path, Path]:
    """Build the corpus and cache it as ``train.txt`` / ``heldout.txt`` in ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    train, heldout = build_corpus(source)
    train_path, heldout_path = out_dir / "train.txt", out_dir / "heldout.txt"
    train_path.write_text(train, encoding="utf-8")
    heldout_path.write_text(heldout, encoding="utf-8")
    return train_path, heldout_path
