"""Synthetic typed graphs shaped like OGB-LSC MAG240M: papers, authors, institutions, in memory.

Three node types and three edge types, as MAG240M has them:

* ``("paper", "cites", "paper")``: a paper (source) cites another (destination);
* ``("author", "writes", "paper")``;
* ``("author", "affiliated_with", "institution")``.

Only papers have features, labels and splits; authors and institutions are featureless (a typed
model derives theirs, e.g. an author's as the mean of its papers' features, as MAG240M's baseline does).

The class signal is spread so that the types matter (the point of a typed benchmark):

* **Papers** have a class (uniform) and features ``signal * mu[class] + noise * z`` with unit-norm
  random class centroids ``mu``: a weak signal, so one paper's features alone predict poorly.
* **Citations** are mildly homophilous: a cited paper has the citing paper's class with probability
  ``cite_homophily``, else a uniformly random class (so it agrees by chance 1/classes of the time).
  Averaging cited papers' features helps, moderately.
* **Authors** have a latent *field* (a class). A paper's authors are, with probability
  ``author_focus`` each, authors of the paper's own field, else any author; so an author writes
  mostly papers of its field, and the mean of its papers' features is a clean estimate of the
  field's centroid. A typed model that sees paper <- author <- paper (an author's other papers)
  therefore predicts far better than citations alone.
* **Institutions** have a home field; an author's affiliation goes to an institution of its own
  field with probability ``institution_focus``, else to one of a field next to it on a ring of
  fields (fields ``f - 1`` and ``f + 1`` are "related"): institutions group authors of related fields.

Degrees are power-law-ish: citation out-degrees are Pareto (exponent ``degree_exponent``, mean
``cites_per_paper``), and the cited paper, the author and the institution are each picked within
their class or field with a Zipf-like skew towards a few popular members (scattered over the ids),
so citation in-degrees, authors' paper counts and institutions' sizes are heavy-tailed. A paper has
``1 + Poisson(authors_per_paper - 1)`` authors; an author ``institutions_per_author`` affiliations,
stochastically rounded. Self-citations and repeated pairs are dropped, so the edge counts come out a
little under the means times the counts.

Everything is vectorised numpy and deterministic for the seed; each part (layout, features, each
edge type, splits) draws from its own stream, so changing one option leaves the others' draws alone.
The arrays live in memory (this is for tests and for benchmarks that scale down MAG240M's shape);
writing them as a typed raw dataset is the raw writer's job.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ...errors import ConfigError
from ..formats.hetero import EdgeType
from .synth import MAX_NODES

if TYPE_CHECKING:
    from torch_geometric.data import HeteroData

__all__ = ["AFFILIATED", "CITES", "EDGE_TYPES", "FEATURE_CHUNK_ROWS", "NODE_TYPES", "WRITES", "HeteroArrays",
           "synth_hetero_arrays", "to_hetero_data"]

NODE_TYPES = ("paper", "author", "institution")
CITES: EdgeType = ("paper", "cites", "paper")
WRITES: EdgeType = ("author", "writes", "paper")
AFFILIATED: EdgeType = ("author", "affiliated_with", "institution")
EDGE_TYPES = (CITES, WRITES, AFFILIATED)

FEATURE_CHUNK_ROWS = 65_536     # features are drawn this many rows at a time (bounds the temporaries)
# One random stream per part: default_rng([seed, tag]).
_TAG_LAYOUT, _TAG_FEATURES, _TAG_CITES, _TAG_WRITES, _TAG_AFFILIATED, _TAG_SPLIT = range(1, 7)


@dataclass(frozen=True)
class HeteroArrays:
    """A synthetic typed graph as numpy arrays, ids local to each node type.

    Attributes:
        num_nodes: nodes per type, in `NODE_TYPES` order.
        x: paper features, float32 [papers, dim].
        y: paper labels (classes), int64 [papers].
        split: paper split codes, uint8 [papers]: 0 train, 1 val, 2 test, 3 none (`SPLITS` order).
        edges: (src, dst) int64 arrays per edge type (`EDGE_TYPES`), sorted by (src, dst), no repeats.
        num_classes: the number of classes.
        author_field: each author's latent field (a class), int64 [authors]: the generator's ground
            truth, for checks; not a feature.
        institution_field: each institution's home field, int64 [institutions]: likewise.
    """

    num_nodes: dict[str, int]
    x: np.ndarray
    y: np.ndarray
    split: np.ndarray
    edges: dict[EdgeType, tuple[np.ndarray, np.ndarray]]
    num_classes: int
    author_field: np.ndarray
    institution_field: np.ndarray

    @property
    def num_edges(self) -> dict[EdgeType, int]:
        """Edges per type."""
        return {et: len(src) for et, (src, _) in self.edges.items()}


def _check(papers: int, authors: int, institutions: int, dim: int, classes: int, cites_per_paper: float,
           authors_per_paper: float, institutions_per_author: float, seed: int, signal: float, noise: float,
           cite_homophily: float, author_focus: float, institution_focus: float, degree_exponent: float,
           train_frac: float, val_frac: float, test_frac: float) -> None:
    """Raise ConfigError naming the first option out of range."""
    values = dict(locals())

    def fail(name: str, fault: str) -> None:
        raise ConfigError(name, f"{fault}, got {values[name]!r}")

    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
            fail(name, "must be a number")
        if name in ("papers", "authors", "institutions", "dim", "classes", "seed") and not isinstance(v, (int, np.integer)):
            fail(name, "must be an integer")
        if not math.isfinite(float(v)):
            fail(name, "must be finite")
    if not 2 <= papers <= MAX_NODES:
        fail("papers", f"must be in [2, {MAX_NODES}]")
    for name in ("authors", "institutions"):
        if not 1 <= values[name] <= MAX_NODES:
            fail(name, f"must be in [1, {MAX_NODES}]")
    if dim < 1:
        fail("dim", "must be >= 1")
    if not 2 <= classes <= papers:
        fail("classes", "must be >= 2 and at most the number of papers")
    if not 0 <= cites_per_paper <= papers - 1:
        fail("cites_per_paper", "must be in [0, papers - 1]")
    if not 1 <= authors_per_paper <= authors:
        fail("authors_per_paper", "must be >= 1 and at most the number of authors")
    if not 0 <= institutions_per_author <= institutions:
        fail("institutions_per_author", "must be >= 0 and at most the number of institutions")
    if seed < 0:
        fail("seed", "must be >= 0")
    for name in ("signal", "noise"):
        if values[name] < 0:
            fail(name, "must be >= 0")
    for name in ("cite_homophily", "author_focus", "institution_focus", "train_frac", "val_frac", "test_frac"):
        if not 0 <= values[name] <= 1:
            fail(name, "must be in [0, 1]")
    if not 2 < degree_exponent <= 10:
        fail("degree_exponent", "must be in (2, 10]")
    if train_frac + val_frac + test_frac > 1 + 1e-9:
        fail("test_frac", f"train + val + test fractions must be <= 1 ({train_frac} + {val_frac} + {test_frac})")


def synth_hetero_arrays(papers: int, authors: int, institutions: int, *, dim: int = 128, classes: int = 16,
                        cites_per_paper: float = 10, authors_per_paper: float = 3,
                        institutions_per_author: float = 1, seed: int = 0, signal: float = 1.2,
                        noise: float = 1.0, cite_homophily: float = 0.4, author_focus: float = 0.7,
                        institution_focus: float = 0.6, degree_exponent: float = 2.5,
                        train_frac: float = 0.6, val_frac: float = 0.2, test_frac: float = 0.2) -> HeteroArrays:
    """A MAG240M-shaped synthetic typed graph (see the module docstring for the design).

    Defaults give a graph where, on 20k papers, 8k authors and 200 institutions (seeds 0-2), ridge
    regression from a paper's features scores about 0.29 (chance: 1/16); from [features, mean of cited
    papers' features] 0.49; adding the mean over the paper's authors of each author's mean paper
    features, 0.77 (tests/operators/ingest/test_synthhetero.py measures all three). With as many authors
    as papers (MAG240M's ratio, about 3 papers an author) the typed read-out still gets 0.66.

    Args:
        papers, authors, institutions: nodes per type.
        dim: paper feature width.
        classes: classes (paper labels, author fields, institution home fields).
        cites_per_paper: mean citations a paper makes (before self-citations and repeats are dropped).
        authors_per_paper: mean authors per paper (>= 1; every paper has at least one).
        institutions_per_author: mean affiliations per author (0: none).
        seed: random seed (>= 0); the result is a function of the arguments.
        signal: length of the class centroid in a paper's features.
        noise: standard deviation of the per-dimension Gaussian noise in a paper's features.
        cite_homophily: probability that a citation goes to a paper of the citing paper's class
            (otherwise a uniformly random class).
        author_focus: probability that each of a paper's authors is one of its field's.
        institution_focus: probability that an affiliation is to an institution of the author's field
            (otherwise of a neighbouring field).
        degree_exponent: gamma of the power laws (citation out-degree; popularity skews), in (2, 10].
        train_frac, val_frac, test_frac: paper split fractions; the rest is split "none" (code 3).

    Raises:
        ConfigError: an option out of range, named.
    """
    _check(papers, authors, institutions, dim, classes, cites_per_paper, authors_per_paper,
           institutions_per_author, seed, signal, noise, cite_homophily, author_focus, institution_focus,
           degree_exponent, train_frac, val_frac, test_frac)
    papers, authors, institutions, dim, classes = int(papers), int(authors), int(institutions), int(dim), int(classes)
    skew = (degree_exponent - 1) / (degree_exponent - 2)   # Zipf-like member choice: in-degree ~ power law gamma

    rng = np.random.default_rng([seed, _TAG_LAYOUT])
    y = rng.integers(0, classes, papers, dtype=np.int64)
    author_field = rng.integers(0, classes, authors, dtype=np.int64)
    # every field has an institution when there are at least as many institutions as fields
    institution_field = rng.permutation(np.arange(institutions, dtype=np.int64) % classes)
    paper_groups = _Groups(y, classes, rng)
    author_groups = _Groups(author_field, classes, rng)
    institution_groups = _Groups(institution_field, classes, rng)
    mu = rng.standard_normal((classes, dim))
    mu /= np.linalg.norm(mu, axis=1, keepdims=True)

    x = _features(np.random.default_rng([seed, _TAG_FEATURES]), y, (mu * signal).astype(np.float32), noise)

    # citations: Pareto out-degrees; the cited paper's class is the citing one's w.p. cite_homophily
    rng = np.random.default_rng([seed, _TAG_CITES])
    src = np.repeat(np.arange(papers, dtype=np.int64), _pareto_counts(rng, papers, cites_per_paper, degree_exponent))
    same = rng.random(len(src)) < cite_homophily
    c_dst = np.where(same, y[src], rng.integers(0, classes, len(src)))
    dst = paper_groups.pick(rng, c_dst, skew)
    keep = src != dst
    cites = _unique_pairs(src[keep], dst[keep], papers)

    # authorship: 1 + Poisson(mean - 1) authors a paper, each of its field w.p. author_focus
    rng = np.random.default_rng([seed, _TAG_WRITES])
    paper = np.repeat(np.arange(papers, dtype=np.int64), 1 + rng.poisson(authors_per_paper - 1, papers))
    focused = rng.random(len(paper)) < author_focus
    field = np.where(focused, y[paper], rng.integers(0, classes, len(paper)))
    author = author_groups.pick(rng, field, skew)
    writes = _unique_pairs(author, paper, papers)

    # affiliations: stochastically rounded counts; the author's field w.p. institution_focus, else a neighbour
    rng = np.random.default_rng([seed, _TAG_AFFILIATED])
    whole = math.floor(institutions_per_author)
    counts = whole + (rng.random(authors) < institutions_per_author - whole)
    member = np.repeat(np.arange(authors, dtype=np.int64), counts)
    side = np.where(rng.random(len(member)) < 0.5, -1, 1)
    home = np.where(rng.random(len(member)) < institution_focus, author_field[member],
                    (author_field[member] + side) % classes)
    affiliated = _unique_pairs(member, institution_groups.pick(rng, home, skew), institutions)

    rng = np.random.default_rng([seed, _TAG_SPLIT])
    bounds = np.cumsum([train_frac, val_frac, test_frac])
    split = np.searchsorted(bounds, rng.random(papers), side="right").astype(np.uint8)

    return HeteroArrays(
        num_nodes={"paper": papers, "author": authors, "institution": institutions},
        x=x, y=y, split=split, edges={CITES: cites, WRITES: writes, AFFILIATED: affiliated},
        num_classes=classes, author_field=author_field, institution_field=institution_field)


def to_hetero_data(arrays: HeteroArrays) -> HeteroData:
    """The graph as PyG's `HeteroData`: ``x``, ``y`` and ``train_mask``/``val_mask``/``test_mask`` on
    papers; ``num_nodes`` on every type (authors and institutions have no ``x``); ``edge_index`` per
    edge type."""
    import torch
    from torch_geometric.data import HeteroData

    data = HeteroData()
    for name in NODE_TYPES:
        data[name].num_nodes = arrays.num_nodes[name]
    data["paper"].x = torch.from_numpy(arrays.x)
    data["paper"].y = torch.from_numpy(arrays.y)
    split = torch.from_numpy(arrays.split)
    for code, name in enumerate(("train", "val", "test")):
        data["paper"][f"{name}_mask"] = split == code
    for et, (src, dst) in arrays.edges.items():
        data[et].edge_index = torch.from_numpy(np.stack([src, dst]))
    return data


# ---------------------------------------------------------------------------- helpers

class _Groups:
    """Nodes grouped by class in a seeded order: member j of class c (0 = most popular) and the class sizes.

    The order within a class is random, so the popular members are scattered over the ids.
    """

    def __init__(self, cls: np.ndarray, classes: int, rng: np.random.Generator) -> None:
        shuffled = rng.permutation(len(cls))
        self.order = shuffled[np.argsort(cls[shuffled], kind="stable")]
        self.size = np.bincount(cls, minlength=classes)
        self.start = np.concatenate([[0], np.cumsum(self.size)[:-1]])

    def pick(self, rng: np.random.Generator, c: np.ndarray, skew: float) -> np.ndarray:
        """One member of each class in `c`, skewed towards the popular ones (P(j < x) = (x/size)**(1/skew));
        a uniformly random node where a class is empty."""
        size = self.size[c]
        u = rng.random(len(c)) ** skew
        j = np.minimum((size * u).astype(np.int64), np.maximum(size - 1, 0))
        anyone = (u * len(self.order)).astype(np.int64)   # fallback for an empty class
        return np.where(size > 0, self.order[np.minimum(self.start[c] + j, len(self.order) - 1)],
                        self.order[np.minimum(anyone, len(self.order) - 1)])


def _pareto_counts(rng: np.random.Generator, n: int, mean: float, gamma: float) -> np.ndarray:
    """n Pareto counts with exponent gamma and the given mean, stochastically rounded, capped at n - 1."""
    if mean <= 0:
        return np.zeros(n, dtype=np.int64)
    x_min = mean * (gamma - 2) / (gamma - 1)
    d = np.minimum(x_min * rng.random(n) ** (-1.0 / (gamma - 1)), n - 1)
    whole = np.floor(d)
    return (whole + (rng.random(n) < d - whole)).astype(np.int64)


def _unique_pairs(src: np.ndarray, dst: np.ndarray, num_dst: int) -> tuple[np.ndarray, np.ndarray]:
    """The distinct (src, dst) pairs, sorted by (src, dst)."""
    key = np.sort(src * num_dst + dst)     # ids <= MAX_NODES: the key fits int64
    key = key[np.concatenate([[True], key[1:] != key[:-1]])] if len(key) else key
    return key // num_dst, key % num_dst


def _features(rng: np.random.Generator, y: np.ndarray, mu: np.ndarray, noise: float) -> np.ndarray:
    """signal * mu[y] + noise * z, float32, drawn in chunks of rows."""
    x = np.empty((len(y), mu.shape[1]), dtype=np.float32)
    for lo in range(0, len(y), FEATURE_CHUNK_ROWS):
        hi = min(lo + FEATURE_CHUNK_ROWS, len(y))
        chunk = x[lo:hi]
        rng.standard_normal(out=chunk, dtype=np.float32)
        chunk *= np.float32(noise)
        chunk += mu[y[lo:hi]]
    return x
