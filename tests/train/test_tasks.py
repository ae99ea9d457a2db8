import random

import pytest
import torch

from trustlens.train.tasks import ArithmeticTask, Problem

TASK = ArithmeticTask()
P = Problem.from_numbers((12, 47, 8), ("+", "+"))


def test_problem_text():
    assert P.prompt == "12 + 47 + 8 ="
    assert P.target == "12 + 47 = 59 ; 59 + 8 = 67 ; answer 67"
    assert P.answer == 67
    assert P.steps == [(12, "+", 47, 59), (59, "+", 8, 67)]
    assert len(P.target.split()) == TASK.response_tokens


def test_problem_other_ops_left_to_right():
    p = Problem.from_numbers((9, 4, 3, 2), ("-", "*", "+"))
    assert p.answer == (9 - 4) * 3 + 2
    assert p.target == "9 - 4 = 5 ; 5 * 3 = 15 ; 15 + 2 = 17 ; answer 17"
    assert len(p.target.split()) == ArithmeticTask(n_operands=4).response_tokens


@pytest.mark.parametrize(
    "response, expected",
    [
        ("12 + 47 = 59 ; 59 + 8 = 67 ; answer 67", 1.0),  # right
        ("12 + 47 = 59 ; 59 + 8 = 67 ; answer 67 <eos>", 1.0),  # special-token text ignored
        ("answer 67", 1.0),  # only the final answer is graded
        ("12 + 47 = 59 ; 59 + 8 = 67 ; answer 67 ; answer 3", 1.0),  # text after the answer ignored
        ("12 + 47 = 59 ; 59 + 8 = 68 ; answer 68", 0.0),  # wrong
        ("12 + 47 = 59 ; 59 + 8 = 67 ; answer 3 ; answer 67", 0.0),  # the first answer counts
        ("12 + 47 = 59 ; 59 + 8 = 67 ; answer", 0.0),  # malformed: no number
        ("12 + 47 = 59 ; 59 + 8 = 67 ; 67", 0.0),  # malformed: no answer word
        ("answer 067", 0.0),  # not the number's token
        ("", 0.0),
        ("answer answer 67", 0.0),
    ],
)
def test_reward_binary(response, expected):
    assert TASK.reward(P, response) == expected


@pytest.mark.parametrize(
    "response, expected",
    [
        ("12 + 47 = 59 ; 59 + 8 = 67 ; answer 67", 1.0),
        ("12 + 47 = 59 ; 59 + 8 = 68 ; answer 68", 0.25),  # one of two steps right
        ("12 + 47 = 59 ; 59 + 8 = 67 ; answer 66", 0.5),  # both steps right, answer wrong
        ("12 + 47 = 59 ; 59 + 8 = 67", 0.5),  # no answer
        ("12 + 47 = 60 ; 60 + 8 = 68 ; answer 68", 0.0),
        ("59 + 8 = 67 ; 12 + 47 = 59 ; answer 1", 0.0),  # steps must be in order
        ("garbage", 0.0),
    ],
)
def test_reward_partial_credit(response, expected):
    task = ArithmeticTask(partial_credit=0.5)
    assert task.reward(P, response) == pytest.approx(expected)


def test_sample_ranges_and_rng_kinds():
    probs = TASK.sample(500, torch.Generator().manual_seed(1))
    assert len(probs) == 500
    for p in probs:
        assert len(p.numbers) == 3 and all(TASK.low <= x <= TASK.high for x in p.numbers)
        assert p.answer == sum(p.numbers)
    assert TASK.sample(20, 5) == TASK.sample(20, torch.Generator().manual_seed(5))
    assert TASK.sample(20, random.Random(3)) == TASK.sample(20, random.Random(3))
    assert TASK.sample(20, 5) != TASK.sample(20, 6)
    with pytest.raises(TypeError, match="rng"):
        TASK.sample(2, "seed")


def test_eval_set_disjoint_from_training_draws():
    ev = TASK.eval_set(300, seed=0)
    assert ev == TASK.eval_set(300, seed=0)
    assert all(TASK.is_eval(p.numbers, p.ops) for p in ev)
    train = TASK.sample(20000, 0)
    assert not {(p.numbers, p.ops) for p in ev} & {(p.numbers, p.ops) for p in train}
    assert not any(TASK.is_eval(p.numbers, p.ops) for p in train)
    # the eval pool is about eval_fraction of all problems
    share = sum(TASK.is_eval((a, b, 7), ("+", "+")) for a in range(100) for b in range(100)) / 1e4
    assert share == pytest.approx(TASK.eval_fraction, abs=0.02)


def test_subtraction_stays_in_vocabulary():
    task = ArithmeticTask(ops=("+", "-"))
    for p in task.sample(300, 0):
        assert all(0 <= s[3] <= task.max_value for s in p.steps)
    assert {op for p in task.sample(300, 0) for op in p.ops} == {"+", "-"}


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(n_operands=1), "n_operands"),
        (dict(low=50, high=10), "low <= high"),
        (dict(high=2000), "max_value"),
        (dict(ops=("/",)), "ops"),
        (dict(eval_fraction=0.0), "eval_fraction"),
        (dict(partial_credit=1.0), "partial_credit"),
    ],
)
def test_bad_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ArithmeticTask(**kwargs)


def test_impossible_config_is_reported():
    task = ArithmeticTask(low=900, high=999, ops=("*",), _max_tries=3)
    with pytest.raises(ValueError, match="could not draw"):
        task.sample(5, 0)


def test_all_valid_paths_are_accepted():
    """Every order of an all-"+" chain is a valid path, its text gets the full reward, and its
    steps earn partial credit like the prompt's own order."""
    sols = P.solutions()
    assert sols[0] == P.target and len(set(sols)) == 6
    assert "8 + 12 = 20 ; 20 + 47 = 67 ; answer 67" in sols
    for text in sols:
        assert TASK.reward(P, text) == 1.0
        assert len(text.split()) == TASK.response_tokens
    task = ArithmeticTask(partial_credit=0.5)
    assert task.reward(P, "47 + 8 = 55 ; 55 + 12 = 66 ; answer 66") == pytest.approx(0.25)
    assert task.reward(P, "47 + 8 = 55 ; 55 + 12 = 67") == pytest.approx(0.5)
    assert task.reward(P, "47 + 8 = 55 ; 59 + 8 = 67") == pytest.approx(0.25)  # mixes two paths


def test_paths_of_repeats_non_commutative_and_out_of_range_orders():
    assert len(Problem.from_numbers((5, 5, 7), ("+", "+")).solutions()) == 3  # distinct orders only
    mixed = Problem.from_numbers((9, 4, 3), ("-", "+"))
    assert mixed.solutions() == [mixed.target]  # "-" fixes the order
    prod = Problem.from_numbers((0, 40, 30), ("*", "*"))  # orders with 40 * 30 = 1200 leave the vocabulary
    assert all("1200" not in s for s in prod.solutions()) and len(prod.solutions()) == 4
    for text in prod.solutions():
        assert TASK.reward(prod, text) == 1.0
