"""Fitted latency model: one layer's time against the tokens of a micro-batch (TeraPipe-style).

For one layer kind on one (gpu, tp), a micro-batch of b sequences of length s carries
T = b x s tokens, and its time is modelled as a roofline-shaped piecewise-linear function

    t(T, s) = max(a, b0 + c x T + d x T x s)        [ms]

* a  : the latency floor, the flat part of the roofline (small shapes that launch-bound
       kernels run in constant time); 0 when the data show no floor;
* b0 : fixed cost per micro-batch (ms);
* c  : cost per token (ms/token): the GEMMs and element-wise work, linear in T;
* d  : cost per token per context token (ms/token^2): the attention scores and context
       (4 b s^2 h FLOPs per attention), used only for kinds with attention when the points
       span at least two sequence lengths (at one length T x s is proportional to T and c
       absorbs it).

Token slices (TeraPipe): s is the number of keys each token attends to, so a slice of l
tokens per row after c context tokens, b rows, is T = b l tokens attending over its l own keys
and c context keys, each context key weighing kappa of an own key (costmodel.context_weight:
2 with a causal flash kernel, which computes half of a row's own block and all of the
context; 1 with a kernel that computes the full block):

    t(l, c) = max(a, b0 + c x b l + d x b l (kappa c + l))               (`predict_slice`)

which is TeraPipe's fitted form t = T0[b, l] + beta0 + beta1 b l + beta2 b c + beta3 b l c with
T0[b, l] + beta0 + beta1 b l = the fit at (b l, l), beta3 = kappa d and beta2 = 0 (the reads of
the cached K/V, proportional to c, are not fitted). The cost model prices slices from any
profile by the same rule (costmodel.slice_context_s): the profile's time of an l-token row plus
the attention core's time at L scaled by kappa l c / L^2, which for a fitted profile is
kappa d b l c.

Fit: least squares on the *relative* error (weights 1/t, since times span orders of
magnitude) with b0, c, d >= 0 (exact non-negative least squares by enumerating the
column subsets, at most seven), and the floor a chosen by enumerating the knee: the k
fastest points form the floor (a is their weighted mean), the others fit the line; the
k with the least error wins, ties to the smaller k. A floor needs points at >= 2 distinct
token counts (flat over a range of T): at one count it would only overfit those points. The fit error is the
leave-one-out relative error |t_pred - t| / t (max and mean), each point predicted by a
fit on the others.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Sequence

import numpy as np

ATTENTION_KINDS = ("block", "encoder_block", "decoder_block")
MIN_POINTS = 3           # fewer points than this: profile.py keeps its linear fill rules
KNEE_TOLERANCE = 1e-10   # a floor must cut the squared relative error by this much per point
MIN_FLOOR = 2            # a floor needs points at >= 2 token counts: else it only overfits


@dataclass(frozen=True)
class LatencyFit:
    """t(T, s) = max(floor_ms, intercept_ms + per_token_ms x T + per_token_seq_ms x T x s)."""

    floor_ms: float
    intercept_ms: float
    per_token_ms: float
    per_token_seq_ms: float
    n_points: int

    def predict(self, tokens: float, seq: float) -> float:
        """Predicted time in ms of a micro-batch of `tokens` tokens at sequence length `seq`."""
        line = self.intercept_ms + self.per_token_ms * tokens + self.per_token_seq_ms * tokens * seq
        return max(self.floor_ms, line)

    def predict_slice(self, rows: int, tokens: int, context: int, kappa: float = 2.0) -> float:
        """Predicted ms of a token slice: `rows` rows of `tokens` tokens after `context` tokens
        of each row, attending over kappa x context + tokens keys (module docstring; kappa =
        costmodel.context_weight: 2 for a causal flash kernel, 1 for the full block)."""
        return self.predict(rows * tokens, kappa * context + tokens)


@dataclass(frozen=True)
class FitError:
    """Leave-one-out relative error of a fit (fractions, 0.05 = 5%)."""

    max_rel: float
    mean_rel: float
    n_points: int


def _columns(tokens: np.ndarray, seqs: np.ndarray, use_seq: bool) -> np.ndarray:
    cols = [np.ones_like(tokens), tokens]
    if use_seq:
        cols.append(tokens * seqs)
    return np.stack(cols, axis=1)


def _nnls(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """min sum (w (x beta - y))^2 subject to beta >= 0: the best non-negative solution of
    the unconstrained fits on every subset of columns (the NNLS optimum is one of them)."""
    n_cols = x.shape[1]
    best, best_err = np.zeros(n_cols), float(np.sum((w * y) ** 2))
    for mask in range(1, 1 << n_cols):
        idx = [j for j in range(n_cols) if mask >> j & 1]
        if len(idx) > len(y):
            continue
        sol, *_ = np.linalg.lstsq(x[:, idx] * w[:, None], y * w, rcond=None)
        if np.any(sol < 0):
            continue
        beta = np.zeros(n_cols)
        beta[idx] = sol
        err = float(np.sum((w * (x @ beta - y)) ** 2))
        if err < best_err * (1 - 1e-12) - 1e-300:
            best, best_err = beta, err
    return best


def _weights(times: np.ndarray) -> np.ndarray:
    scale = float(np.max(np.abs(times))) or 1.0
    return 1.0 / np.maximum(np.abs(times), 1e-9 * scale)


def _fit_arrays(tokens: np.ndarray, seqs: np.ndarray, times: np.ndarray, use_seq: bool) -> LatencyFit:
    n = len(times)
    if not np.any(times):
        return LatencyFit(0.0, 0.0, 0.0, 0.0, n)
    x, w = _columns(tokens, seqs, use_seq), _weights(times)
    order = np.argsort(times, kind="stable")
    best: tuple[float, LatencyFit] | None = None
    for k in [0, *range(MIN_FLOOR, n - 1)]:
        floor_idx, line_idx = order[:k], order[k:]
        if k and len(set(tokens[floor_idx].tolist())) < MIN_FLOOR:
            continue
        a = float(np.sum(w[floor_idx]) / np.sum(w[floor_idx] ** 2)) if k else 0.0
        beta = _nnls(x[line_idx], times[line_idx], w[line_idx])
        pred = np.maximum(a, x @ beta)
        err = float(np.sum((w * (pred - times)) ** 2))
        if best is None or err < best[0] - KNEE_TOLERANCE * n:
            d = float(beta[2]) if use_seq else 0.0
            best = (err, LatencyFit(a, float(beta[0]), float(beta[1]), d, n))
    assert best is not None
    return best[1]


def _uses_seq(seqs: Sequence[float], attention: bool) -> bool:
    return attention and len(set(seqs)) >= 2


def fit(tokens: Sequence[float], seqs: Sequence[float], times_ms: Sequence[float],
        attention: bool = False) -> LatencyFit:
    """Fit t(T, s) to measured points (tokens per micro-batch, sequence length, ms).

    attention: the kind has attention (block kinds), so the d x T x s term is fitted when
    the points span two or more sequence lengths."""
    if not (len(tokens) == len(seqs) == len(times_ms)) or len(times_ms) < 1:
        raise ValueError("fit needs equally long, non-empty tokens, seqs and times")
    return _fit_cached(tuple(map(float, tokens)), tuple(map(float, seqs)), tuple(map(float, times_ms)),
                       _uses_seq(seqs, attention))


@functools.lru_cache(maxsize=4096)
def _fit_cached(tokens: tuple, seqs: tuple, times: tuple, use_seq: bool) -> LatencyFit:
    return _fit_arrays(np.array(tokens), np.array(seqs), np.array(times), use_seq)


def loo_error(tokens: Sequence[float], seqs: Sequence[float], times_ms: Sequence[float],
              attention: bool = False) -> FitError | None:
    """Leave-one-out relative error: each point predicted by the fit on all the others.
    None with fewer than MIN_POINTS points."""
    n = len(times_ms)
    if n < MIN_POINTS:
        return None
    errs = []
    for i in range(n):
        rest = [j for j in range(n) if j != i]
        f = fit([tokens[j] for j in rest], [seqs[j] for j in rest], [times_ms[j] for j in rest], attention)
        t = times_ms[i]
        pred = f.predict(tokens[i], seqs[i])
        errs.append(abs(pred - t) / t if t > 0 else (0.0 if pred == 0 else float("inf")))
    return FitError(float(max(errs)), float(np.mean(errs)), n)


@dataclass(frozen=True)
class FitReport:
    """The fit of one field (fwd_ms, bwd_ms, ...) of one (model, gpu, tp, kind) over all its points."""

    model: str
    gpu: str
    tp: int
    kind: str
    field: str
    fit: LatencyFit
    error: FitError | None


def fit_table(table, fields: Sequence[str] = ("fwd_ms", "bwd_ms")) -> list[FitReport]:
    """Fit every (model, gpu, tp, kind) of a native profile table (a pandas DataFrame with
    the columns of milp_plan.profile) over all its micro-batch sizes and sequence lengths."""
    out = []
    for (model, gpu, tp, kind), sub in table.groupby(["model", "gpu", "tp", "kind"], sort=True):
        sub = sub.sort_values(["seq_length", "micro_batch_size"])
        tokens = (sub.micro_batch_size * sub.seq_length).astype(float).tolist()
        seqs = sub.seq_length.astype(float).tolist()
        for name in fields:
            if name not in sub.columns or sub[name].isna().any():
                continue
            times = sub[name].astype(float).tolist()
            attention = kind in ATTENTION_KINDS
            out.append(FitReport(str(model), str(gpu), int(tp), str(kind), name,
                                 fit(tokens, seqs, times, attention), loo_error(tokens, seqs, times, attention)))
    return out
