"""The typed synthetic generator: deterministic, well-formed, and its class signal where it was put.

The signal check reads the graph with closed-form linear predictors (ridge regression, one solve), no
training loop: a paper's own features, plus the mean of its cited papers' features, plus the mean over
its authors of each author's mean paper features (MAG240M's way of giving authors features). The
typed read-out must beat the citations-only one by a clear margin, and both must beat chance.
"""
from __future__ import annotations

import numpy as np
import pytest
from diskflow.operators.ingest.synthhetero import (
    AFFILIATED,
    CITES,
    EDGE_TYPES,
    NODE_TYPES,
    WRITES,
    HeteroArrays,
    synth_hetero_arrays,
    to_hetero_data,
)

from diskflow.errors import ConfigError

SMALL = {"papers": 20_000, "authors": 8_000, "institutions": 200}
TINY = {"papers": 500, "authors": 120, "institutions": 9, "dim": 8, "classes": 4}


def mean_by(group: np.ndarray, rows: np.ndarray, x: np.ndarray, n: int) -> np.ndarray:
    """Row g of the result: the mean of x[rows[i]] over the i with group[i] == g (zeros where none)."""
    order = np.argsort(group, kind="stable")
    group, rows = group[order], rows[order]
    out = np.zeros((n, x.shape[1]), dtype=np.float64)
    if len(group):
        starts = np.flatnonzero(np.concatenate([[True], group[1:] != group[:-1]]))
        out[group[starts]] = np.add.reduceat(x[rows].astype(np.float64), starts, axis=0)
    count = np.bincount(group, minlength=n)
    return out / np.maximum(count, 1)[:, None]


def ridge_accuracy(feats: np.ndarray, g: HeteroArrays, lam: float = 1.0) -> float:
    """Validation accuracy of ridge regression onto one-hot labels, fitted on the train papers."""
    z = np.hstack([feats, np.ones((len(feats), 1))])
    train, val = g.split == 0, g.split == 1
    a = z[train]
    target = np.eye(g.num_classes)[g.y[train]]
    w = np.linalg.solve(a.T @ a + lam * np.eye(a.shape[1]), a.T @ target)
    return float(np.mean(np.argmax(z[val] @ w, axis=1) == g.y[val]))


def accuracies(g: HeteroArrays) -> dict[str, float]:
    """Ridge accuracies from [x], [x, cited], [x, cited, authors' paper means]."""
    n_p, n_a = g.num_nodes["paper"], g.num_nodes["author"]
    citing, cited = g.edges[CITES]
    author, paper = g.edges[WRITES]
    cited_mean = mean_by(citing, cited, g.x, n_p)
    author_x = mean_by(author, paper, g.x, n_a)          # an author's features: the mean of its papers'
    authors_mean = mean_by(paper, author, author_x, n_p)
    return {"x": ridge_accuracy(g.x, g),
            "cites": ridge_accuracy(np.hstack([g.x, cited_mean]), g),
            "typed": ridge_accuracy(np.hstack([g.x, cited_mean, authors_mean]), g)}


def test_deterministic() -> None:
    a, b = synth_hetero_arrays(**TINY, seed=5), synth_hetero_arrays(**TINY, seed=5)
    c = synth_hetero_arrays(**TINY, seed=6)
    for name in ("x", "y", "split", "author_field", "institution_field"):
        assert np.array_equal(getattr(a, name), getattr(b, name))
    for et in EDGE_TYPES:
        assert all(np.array_equal(u, v) for u, v in zip(a.edges[et], b.edges[et], strict=True))
    assert not np.array_equal(a.x, c.x) and not np.array_equal(a.edges[CITES][1], c.edges[CITES][1])


def test_shapes_and_ranges() -> None:
    g = synth_hetero_arrays(**TINY, seed=1)
    n = g.num_nodes
    assert n == {"paper": 500, "author": 120, "institution": 9} and tuple(n) == NODE_TYPES
    assert g.x.shape == (500, 8) and g.x.dtype == np.float32 and np.isfinite(g.x).all()
    assert g.y.dtype == np.int64 and g.y.shape == (500,) and g.y.min() >= 0 and g.y.max() < 4
    assert g.split.dtype == np.uint8 and set(np.unique(g.split)) <= {0, 1, 2}
    assert tuple(g.edges) == EDGE_TYPES
    for (s, _, d), (src, dst) in g.edges.items():
        assert src.dtype == dst.dtype == np.int64 and len(src) == len(dst) > 0
        assert 0 <= src.min() and src.max() < n[s] and 0 <= dst.min() and dst.max() < n[d]
        key = src * n[d] + dst
        assert np.all(np.diff(key) > 0)                   # sorted by (src, dst), no repeats
    citing, cited = g.edges[CITES]
    assert not np.any(citing == cited)
    assert np.array_equal(np.unique(g.edges[WRITES][1]), np.arange(500))   # every paper has an author
    assert np.array_equal(np.unique(g.edges[AFFILIATED][0]), np.arange(120))  # one affiliation each by default
    assert g.author_field.shape == (120,) and g.institution_field.shape == (9,)
    # split fractions are honoured; the rest is split "none"
    counts = np.bincount(synth_hetero_arrays(**TINY, train_frac=0.5, val_frac=0.1, test_frac=0.1).split, minlength=4)
    assert counts.sum() == 500 and 200 < counts[0] < 300 and counts[3] > 100


def test_degrees_follow_the_means() -> None:
    g = synth_hetero_arrays(**SMALL, dim=4)
    e = g.num_edges
    assert 8 * 20_000 < e[CITES] <= 10.5 * 20_000
    assert 2.7 * 20_000 < e[WRITES] <= 3.1 * 20_000
    assert e[AFFILIATED] == 8_000
    papers_per_author = np.bincount(g.edges[WRITES][0], minlength=8_000)
    assert papers_per_author.max() > 20 * papers_per_author.mean()     # a heavy tail of prolific authors
    # authors write mostly papers of their field; institutions hold authors of their field or a neighbour
    author, paper = g.edges[WRITES]
    assert np.mean(g.author_field[author] == g.y[paper]) > 0.7
    member, inst = g.edges[AFFILIATED]
    gap = (g.author_field[member] - g.institution_field[inst]) % g.num_classes
    assert np.all(np.isin(gap, [0, 1, g.num_classes - 1])) and np.mean(gap == 0) > 0.5


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_authors_carry_the_signal(seed: int) -> None:
    acc = accuracies(synth_hetero_arrays(**SMALL, seed=seed))
    chance = 1 / 16
    assert chance + 0.1 < acc["x"] < acc["cites"]
    assert acc["cites"] + 0.05 <= acc["typed"]


def test_to_hetero_data() -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("torch_geometric")
    g = synth_hetero_arrays(**TINY, seed=2)
    data = to_hetero_data(g)
    assert data.node_types == list(NODE_TYPES) and data.edge_types == list(EDGE_TYPES)
    assert data["author"].num_nodes == 120 and data["institution"].num_nodes == 9
    assert "x" not in data["author"] and "x" not in data["institution"]
    assert torch.equal(data["paper"].x, torch.from_numpy(g.x)) and data["paper"].y.dtype == torch.int64
    masks = torch.stack([data["paper"][f"{s}_mask"] for s in ("train", "val", "test")])
    assert masks.dtype == torch.bool and masks.sum(0).max() == 1 and int(masks.sum()) == 500
    for et in EDGE_TYPES:
        ei = data[et].edge_index
        assert ei.dtype == torch.int64 and torch.equal(ei[0], torch.from_numpy(g.edges[et][0]))
    data.validate()


@pytest.mark.parametrize(("option", "value"), [
    ("papers", 1), ("authors", 0), ("classes", 1), ("dim", 0), ("authors_per_paper", 0.5),
    ("cite_homophily", 1.5), ("seed", -1), ("dim", 2.5), ("signal", float("nan")), ("test_frac", 0.5),
])
def test_bad_options_name_the_option(option: str, value: object) -> None:
    with pytest.raises(ConfigError, match=f"^{option}: "):
        synth_hetero_arrays(**{**TINY, option: value})
