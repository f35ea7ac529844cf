"""What one step processes when sequence lengths vary: a length histogram and its buckets.

* `read_lengths(path)`: a CSV with a header `length,count` (whole tokens, sequences).
* `lognormal(mean, cap, sequences, seed)`: a synthetic long-tailed histogram: lengths drawn
  from a log-normal with the given mean (sigma LOGNORMAL_SIGMA), rounded up to whole tokens
  and clipped at `cap`; the same (mean, cap, sequences, seed) gives the same histogram.
* `buckets(hist, edges)`: each bucket holds the sequences whose length is in (previous edge,
  edge]; the default edges are powers of two from 512 up to the longest sequence's.

Rows: a sequence is padded to its bucket's upper edge (one row of `edge` tokens per
sequence). HotSPa packs sequences into rows instead; packing's row count is a bin-packing
problem, padding's is exact, so the model states padding and its waste (`Bucket.padding`).
"""
from __future__ import annotations

import csv
import math
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from milp_plan.errors import InputError

LOGNORMAL_SIGMA = 1.0     # the spread of the synthetic distribution (log scale)
MIN_EDGE = 512            # the smallest default bucket edge (tokens)


@dataclass(frozen=True)
class Histogram:
    """(length in tokens, sequences) pairs, lengths ascending and distinct."""
    counts: tuple[tuple[int, int], ...]
    source: str = ""

    @property
    def sequences(self) -> int:
        return sum(c for _, c in self.counts)

    @property
    def tokens(self) -> int:
        return sum(l * c for l, c in self.counts)

    @property
    def longest(self) -> int:
        return self.counts[-1][0]


@dataclass(frozen=True)
class Bucket:
    edge: int          # row length (tokens): every sequence of the bucket is padded to it
    sequences: int
    tokens: int        # before padding

    @property
    def padding(self) -> float:
        """Share of the bucket's rows that is padding."""
        return 1 - self.tokens / (self.edge * self.sequences)


def _histogram(pairs: dict[int, int], source: str) -> Histogram:
    counts = tuple(sorted((l, c) for l, c in pairs.items() if c > 0))
    if not counts:
        raise InputError("no sequences: every count is 0", source=source, field="count")
    return Histogram(counts, source)


def read_lengths(path: str | Path) -> Histogram:
    """A `length,count` CSV (one-line InputError naming the file, the row and the fix)."""
    src = str(path)
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise InputError(f"cannot read the lengths file ({exc.strerror}); give a CSV with a header length,count",
                         source=src) from None
    rows = list(csv.reader(text.splitlines()))
    if not rows or [c.strip() for c in rows[0]] != ["length", "count"]:
        raise InputError("the first line must be the header 'length,count'", source=src, field="header")
    pairs: dict[int, int] = {}
    for i, row in enumerate(rows[1:], start=2):
        if not row or not "".join(row).strip():
            continue
        try:
            length, count = (int(c) for c in row)
        except ValueError:
            raise InputError(f"line {i}: want two whole numbers 'length,count', got {','.join(row)[:40]!r}",
                             source=src, field="length") from None
        if length < 1 or count < 0:
            raise InputError(f"line {i}: length must be >= 1 and count >= 0, got {length},{count}", source=src,
                             field="length" if length < 1 else "count")
        pairs[length] = pairs.get(length, 0) + count
    return _histogram(pairs, src)


def lognormal(mean: float, cap: int, sequences: int, seed: int = 1) -> Histogram:
    """`sequences` lengths from a log-normal of mean `mean` tokens, clipped to [1, cap]."""
    if not (1 <= mean <= cap and sequences >= 1):
        raise InputError(f"want 1 <= mean <= cap and at least one sequence, got mean {mean}, cap {cap}, "
                         f"sequences {sequences}", field="lengths")
    mu = math.log(mean) - LOGNORMAL_SIGMA ** 2 / 2   # E[X] = exp(mu + sigma^2 / 2)
    rng = random.Random(seed)
    pairs: dict[int, int] = {}
    for _ in range(sequences):
        length = min(cap, max(1, math.ceil(rng.lognormvariate(mu, LOGNORMAL_SIGMA))))
        pairs[length] = pairs.get(length, 0) + 1
    return _histogram(pairs, f"lognormal(mean {mean:g}, cap {cap}, {sequences} sequences, seed {seed})")


EXACT_BINS = 12           # a histogram of at most this many lengths is binned at its own lengths


def default_edges(hist: Histogram) -> tuple[int, ...]:
    """The histogram's own lengths when it has at most EXACT_BINS of them (no padding inside a
    bin), else powers of two from MIN_EDGE up to the first that holds the longest sequence."""
    if len(hist.counts) <= EXACT_BINS:
        return tuple(l for l, _ in hist.counts)
    edges = [MIN_EDGE]
    while edges[-1] < hist.longest:
        edges.append(edges[-1] * 2)
    return tuple(edges)


def buckets(hist: Histogram, edges: Sequence[int] | None = None) -> tuple[Bucket, ...]:
    """The non-empty buckets, shortest first."""
    edges = tuple(sorted(set(edges))) if edges else default_edges(hist)
    if edges[0] < 1 or edges[-1] < hist.longest:
        raise InputError(f"the largest bucket edge ({edges[-1]}) must hold the longest sequence ({hist.longest} "
                         f"tokens); add an edge of at least {hist.longest}", source=hist.source, field="buckets")
    return tuple(Bucket(edge, sum(c for _, c in inside), sum(l * c for l, c in inside))
                 for edge, inside in zip(edges, _split(hist.counts, edges)) if inside)


def _split(pairs, edges: Sequence[int]) -> list[list[tuple[int, int]]]:
    """The (length, count) pairs in each bucket (previous edge, edge]; edges ascending."""
    out, lo = [], 0
    for edge in edges:
        out.append([(l, c) for l, c in pairs if lo < l <= edge])
        lo = edge
    return out


EXAMPLE = Path(__file__).parent / "catalog" / "lengths-example.csv"   # `--lengths example`: synthetic, made
# by lognormal(2048, 16384, 256, seed 1) and written out as a CSV (no third-party data)


def parse_lengths(spec: str) -> Histogram:
    """`--lengths`: a CSV path, `example` (the shipped EXAMPLE), or lognormal:MEAN:CAP:SEQUENCES[:SEED]."""
    if spec == "example":
        return read_lengths(EXAMPLE)
    if spec.startswith("lognormal:"):
        parts = spec.split(":")[1:]
        try:
            mean, cap, n, *seed = (float(parts[0]), *(int(x) for x in parts[1:]))
        except (ValueError, IndexError):
            raise InputError(f"write it like lognormal:2048:16384:256 (mean, cap, sequences[, seed]), got {spec!r}",
                             field="lengths") from None
        if len(seed) > 1:
            raise InputError(f"lognormal takes mean, cap, sequences and a seed at most, got {spec!r}", field="lengths")
        return lognormal(mean, cap, n, *seed)
    return read_lengths(spec)


def parse_edges(text: str) -> tuple[int, ...]:
    try:
        edges = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise InputError(f"bucket edges are whole token counts, e.g. 2048,4096,16384; got {text!r}",
                         field="buckets") from None
    if not edges or min(edges) < 1:
        raise InputError(f"bucket edges are whole token counts >= 1, e.g. 2048,4096,16384; got {text!r}",
                         field="buckets")
    return edges


def scaled(hist: Histogram, sequences: int | None = None, tokens: int | None = None) -> Histogram:
    """The distribution's shape at another global batch: `sequences`, or as many as hold about
    `tokens` at its mean length; counts by largest remainder (ties to the shorter length),
    lengths whose share rounds to none dropped."""
    if tokens is not None:
        sequences = max(1, round(tokens * hist.sequences / hist.tokens))
    if sequences is None or sequences == hist.sequences:
        return hist
    if sequences < 1:
        raise InputError(f"the global batch must hold at least one sequence, got {sequences}", field="global-batch")
    exact = [(c * sequences / hist.sequences, i) for i, (_, c) in enumerate(hist.counts)]
    counts = [int(x) for x, _ in exact]
    for _, i in sorted(exact, key=lambda e: (-(e[0] - int(e[0])), e[1]))[:sequences - sum(counts)]:
        counts[i] += 1
    return _histogram({l: n for (l, _), n in zip(hist.counts, counts)},
                      f"{hist.source} scaled to {sequences} sequences")


def sample_batches(hist: Histogram, count: int, seed: int) -> list[tuple[int, ...]]:
    """`count` global batches of hist.sequences lengths each, drawn with replacement from the
    histogram (lengths sorted within a batch); the same (hist, count, seed) gives the same."""
    rng = random.Random(seed)
    lengths = [l for l, _ in hist.counts]
    weights = [c for _, c in hist.counts]
    return [tuple(sorted(rng.choices(lengths, weights, k=hist.sequences))) for _ in range(count)]


def bucket_counts(lengths: Sequence[int], edges: Sequence[int]) -> list[int]:
    """How many of `lengths` fall in each bucket (previous edge, edge]; edges ascending, the
    last holding the longest."""
    if lengths and max(lengths) > edges[-1]:
        raise InputError(f"a sequence of {max(lengths)} tokens is longer than the last bucket edge ({edges[-1]})",
                         field="buckets")
    return [sum(c for _, c in inside) for inside in _split(sorted(Counter(lengths).items()), edges)]
