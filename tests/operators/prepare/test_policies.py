"""Tier policies: built-in names, a user's function and the checks on its answer, and the tiers both the offline
preparation and the stream take from `choose_tiers`."""
from __future__ import annotations

import numpy as np
import pytest
from diskflow.operators.prepare.plan import initial_fill, static_tier
from diskflow.operators.prepare.policies import check_policy, choose_tier, choose_tiers, planned, policy_id

from diskflow.errors import ConfigError, InputError

COUNTS = np.array([5, 0, 9, 9, 1, 7, 0, 3], np.int64)


def test_builtin_names_and_functions_are_policies() -> None:
    check_policy("hottest", "gpu")
    check_policy("belady", "cpu")
    check_policy("static", "cpu")
    check_policy(lambda c, r, e: np.zeros(0, np.int64), "cpu")
    with pytest.raises(ConfigError, match="gpu_tier: expected one of hottest or a function"):
        check_policy("belady", "gpu")
    with pytest.raises(ConfigError, match="cpu_policy: expected one of belady, static"):
        check_policy("lru", "cpu", "cpu_policy")
    assert planned("belady") and not planned("static") and not planned(lambda c, r, e: c)


def test_a_policy_id_names_the_function_and_hashes_its_code() -> None:
    def mine(counts, rows, exclude):
        return np.zeros(0, np.int64)

    def other(counts, rows, exclude):
        return np.ones(1, np.int64)

    assert policy_id("static") == "static"
    assert policy_id(mine).split("#")[0].endswith("mine") and policy_id(mine) == policy_id(mine)
    assert policy_id(mine).split("#")[1] != policy_id(other).split("#")[1]


def test_a_users_answer_is_checked_and_a_fault_names_the_policy() -> None:
    def answer(ids):
        return lambda counts, rows, exclude: ids

    assert choose_tier(answer([2, 5]), COUNTS, 3, np.array([3]), "cpu").tolist() == [2, 5]
    faults = {"returned 4 ids for a tier of 3 rows": [0, 2, 4, 5], "returned ids outside 0..7": [2, 8],
              "returned the same id twice": [2, 2], "returned ids of a faster tier": [2, 3],
              "not a 1-d array of node ids": [[1, 2]]}
    for fault, ids in faults.items():
        with pytest.raises(ConfigError, match=f"cpu_tier: the policy .*{fault}"):
            choose_tier(answer(ids), COUNTS, 3, np.array([3]), "cpu")

    def writes(counts, rows, exclude):
        counts[0] = 0       # the counts are read-only
        return np.zeros(0, np.int64)

    with pytest.raises(ConfigError, match="failed: ValueError"):
        choose_tier(writes, COUNTS, 3, np.zeros(0, np.int64), "cpu")
    assert COUNTS[0] == 5


def test_choose_tiers_static_planned_and_resumed() -> None:
    batches = [np.array([0, 2, 4]), np.array([5, 7])]
    called = []

    def first():
        called.append(1)
        return batches

    gpu, cpu = choose_tiers("hottest", "static", COUNTS, 2, 4, first)
    assert gpu.tolist() == [2, 3] and not called         # static: the first batches are never read
    assert static_tier(COUNTS, 4, gpu).tolist() == [5, 0, 7, 4]   # the hottest outside the GPU tier,
    assert cpu.tolist() == [0, 4, 5, 7]                              # laid out in node order
    gpu, cpu = choose_tiers("hottest", "belady", COUNTS, 2, 4, first)
    fill = initial_fill(batches, 4, COUNTS, gpu)
    assert called and cpu.tolist() == sorted(fill[fill >= 0].tolist()) + [-1] * int((fill < 0).sum())
    gpu, cpu = choose_tiers("hottest", lambda c, r, e: np.array([1]), COUNTS, 2, 4, first)
    assert cpu.tolist() == [1, -1, -1, -1]                # a user's static tier, empty slots after it
    called.clear()
    saved = np.array([7, -1, 4, 0])
    gpu, cpu = choose_tiers("hottest", "belady", COUNTS, 2, 4, first, cpu_slots=saved)
    assert cpu.tolist() == saved.tolist() and not called  # resumed: no policy runs
    with pytest.raises(InputError, match="holds 3 CPU-tier slots, this run's budget gives 4"):
        choose_tiers("hottest", "belady", COUNTS, 2, 4, first, cpu_slots=saved[:3])
