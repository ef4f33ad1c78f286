"""A link task's evaluation figures: ROC-AUC over every scored pair, and the MRR and Hits@K of each positive
ranked against its own fixed negatives, as OGB's link benchmarks compute them (a tie counts half: the
rank is the mean of the optimistic and the pessimistic one). Plain numpy over the scores, no torch."""
from __future__ import annotations

import math

import numpy as np

__all__ = ["link_figures", "ranks", "roc_auc"]


def roc_auc(pos: np.ndarray, neg: np.ndarray) -> float:
    """The probability that a positive scores above a negative (ties half), from the rank sum of the
    positives among all scores (Mann-Whitney); NaN without positives or negatives."""
    pos = np.asarray(pos, dtype=np.float64).ravel()
    neg = np.asarray(neg, dtype=np.float64).ravel()
    if not pos.size or not neg.size:
        return math.nan
    scores = np.concatenate([pos, neg])
    order = np.argsort(scores, kind="stable")
    _, inverse, counts = np.unique(scores[order], return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    average = ends - (counts - 1) / 2.0                  # the mean 1-based rank of each group of ties
    rank = np.empty(scores.shape[0], dtype=np.float64)
    rank[order] = average[inverse]
    p, n = pos.shape[0], neg.shape[0]
    return float((rank[:p].sum() - p * (p + 1) / 2.0) / (p * n))


def ranks(pos: np.ndarray, neg: np.ndarray) -> np.ndarray:
    """Each positive's rank among itself and its own negatives (`neg`: [P, K]), ties counting half."""
    pos = np.asarray(pos, dtype=np.float64).reshape(-1, 1)
    neg = np.asarray(neg, dtype=np.float64).reshape(pos.shape[0], -1)
    optimistic = (neg > pos).sum(axis=1)
    pessimistic = (neg >= pos).sum(axis=1)
    return 0.5 * (optimistic + pessimistic) + 1.0


def link_figures(pos: np.ndarray, neg: np.ndarray, hits_k: int) -> dict[str, float]:
    """``auc``, ``mrr`` and ``hits`` (Hits@`hits_k`) of positives `pos` ([P]) against their negatives `neg`
    ([P, K]); NaN for an empty split."""
    pos = np.asarray(pos, dtype=np.float64).ravel()
    if not pos.size:
        return {"auc": math.nan, "mrr": math.nan, "hits": math.nan}
    r = ranks(pos, neg)
    return {"auc": roc_auc(pos, neg), "mrr": float((1.0 / r).mean()), "hits": float((r <= hits_k).mean())}
