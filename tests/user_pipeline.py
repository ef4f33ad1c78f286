"""The user pipeline that the README shows, word for word (tests/pipelines/test_user_pipeline.py keeps them
equal): its own CPU tier policy, packed like belady, so the same samples and the same losses."""

USER_PIPELINE = '''\
import numpy as np
import diskflow


def every_other_hot_row(counts: np.ndarray, rows: int, exclude: np.ndarray) -> np.ndarray:
    """The CPU tier: every other row of the most accessed ones outside the GPU tier."""
    hot = np.argsort(-counts, kind="stable")
    hot = hot[(counts[hot] > 0) & ~np.isin(hot, exclude)]
    return hot[::2][:rows]


pipeline = diskflow.Pipeline("every-other", cpu_tier=every_other_hot_row, packing=True)
'''
