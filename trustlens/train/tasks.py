"""The built-in RL task: multi-step arithmetic with a short scratchpad.

A problem is a left-to-right chain of operations on small integers, e.g. ``12 + 47 + 8 =``. The
model answers with one scratchpad step per operation and a final answer::

    12 + 47 = 59 ; 59 + 8 = 67 ; answer 67

Every number is a single token (the tokenizer of `trustlens.train.model` has one token per integer
0..999), so the vocabulary has a long tail and, as in a real LLM, a low-probability alternative
to a sampled token is usually another number.

Several valid solution paths: when a problem's operations are all ``+`` (or all ``*``), the
scratchpad may combine the operands in any order, e.g. ``47 + 8 = 55 ; 55 + 12 = 67 ; answer
67`` or ``8 + 12 = 20 ; 20 + 47 = 67 ; answer 67`` for the problem above (`Problem.solutions`;
orders whose intermediate value leaves [0, max_value] are not valid). The warm-up
(`trustlens.train.warmup`) writes the prompt's own order most of the time and the other orders
rarely, so a low-μ token at the start of a step is sometimes the start of another right path,
not a mistake.

Held-out evaluation: a stable hash of (numbers, ops) assigns each problem to the training pool or
the eval pool once and for all, so `ArithmeticTask.sample` never draws a problem that
`ArithmeticTask.eval_set` can return (the individual two-number steps are shared; whole problems
are not).

Reward: 1.0 when the number right after the first ``answer`` token equals the true result, else
0.0, whichever path the scratchpad took. With ``partial_credit = c > 0`` a wrong or missing final
answer earns ``c * (scratchpad steps written exactly right, in order) / (number of steps)``
instead, counted against the valid path that the scratchpad matches best.
"""

from __future__ import annotations

import hashlib
import itertools
import random
from dataclasses import dataclass, field

import torch

# operator symbol -> how it combines the running value with the next number
_OPS = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
}
COMMUTATIVE = ("+", "*")  # ops whose all-same chains may combine the operands in any order
STEP_SEP = ";"  # separates scratchpad steps
ANSWER = "answer"  # the word before the final answer


@dataclass(frozen=True)
class Problem:
    """One arithmetic problem.

    `numbers` are the operands in order and `ops[i]` combines the running value with
    `numbers[i + 1]`; `prompt` is what the model is given (``"12 + 47 + 8 ="``), `target` the
    scratchpad response a perfect model writes (without end-of-sequence token) and `answer` the
    final value.
    """

    numbers: tuple[int, ...]
    ops: tuple[str, ...]
    prompt: str
    target: str
    answer: int

    @classmethod
    def from_numbers(cls, numbers: tuple[int, ...], ops: tuple[str, ...]) -> Problem:
        """Build the prompt, scratchpad and answer of `numbers` combined left to right by `ops`."""
        if len(numbers) < 2 or len(ops) != len(numbers) - 1:
            raise ValueError(
                f"Problem.from_numbers: need >= 2 numbers and one op between each pair, got numbers={numbers} ops={ops}"
            )
        unknown = [op for op in ops if op not in _OPS]
        if unknown:
            raise ValueError(f"Problem.from_numbers: unknown ops {unknown}; known: {sorted(_OPS)}")
        steps = _steps(numbers, ops)
        prompt = " ".join(_interleave(numbers, ops)) + " ="
        return cls(tuple(numbers), tuple(ops), prompt, _scratchpad(steps), steps[-1][3])

    @property
    def steps(self) -> list[tuple[int, str, int, int]]:
        """The scratchpad steps as (running value, op, next number, result)."""
        return _steps(self.numbers, self.ops)

    def paths(self, max_value: int = 999) -> list[list[tuple[int, str, int, int]]]:
        """Every valid path of scratchpad steps, the prompt's own order first.

        A chain of one commutative op (all ``+`` or all ``*``) may take its operands in any order
        (distinct orders only; an order is valid when every intermediate value is in
        [0, `max_value`]); any other chain has its left-to-right path only.
        """
        out = [self.steps]
        if len(set(self.ops)) == 1 and self.ops[0] in COMMUTATIVE:
            seen = {self.numbers}
            for order in itertools.permutations(self.numbers):
                if order in seen:
                    continue
                seen.add(order)
                steps = _steps(order, self.ops)
                if all(0 <= s[3] <= max_value for s in steps):
                    out.append(steps)
        return out

    def solutions(self, max_value: int = 999) -> list[str]:
        """The scratchpad text of every valid path (`paths`), `target` first."""
        return [_scratchpad(steps) for steps in self.paths(max_value)]


def _steps(numbers, ops) -> list[tuple[int, str, int, int]]:
    value, out = numbers[0], []
    for op, b in zip(ops, numbers[1:], strict=True):
        result = _OPS[op](value, b)
        out.append((value, op, b, result))
        value = result
    return out


def _scratchpad(steps: list[tuple[int, str, int, int]]) -> str:
    text = f" {STEP_SEP} ".join(f"{a} {op} {b} = {c}" for a, op, b, c in steps)
    return text + f" {STEP_SEP} {ANSWER} {steps[-1][3]}"


def _interleave(numbers, ops) -> list[str]:
    words = [str(numbers[0])]
    for op, b in zip(ops, numbers[1:], strict=True):
        words += [op, str(b)]
    return words


def _as_generator(rng: torch.Generator | random.Random | int) -> torch.Generator:
    """A torch.Generator from a generator, a `random.Random` (consumes 63 bits of it) or a seed."""
    if isinstance(rng, torch.Generator):
        return rng
    if isinstance(rng, random.Random):
        return torch.Generator().manual_seed(rng.getrandbits(63))
    if isinstance(rng, int) and not isinstance(rng, bool):
        return torch.Generator().manual_seed(rng)
    raise TypeError(f"rng: expected a torch.Generator, random.Random or int seed, got {type(rng).__name__}")


@dataclass(frozen=True)
class ArithmeticTask:
    """Configuration of the arithmetic task (see the module docstring for format and reward)."""

    n_operands: int = 3  # numbers per problem (n_operands - 1 scratchpad steps)
    low: int = 0  # smallest operand
    high: int = 49  # largest operand (inclusive)
    ops: tuple[str, ...] = ("+",)  # operators drawn uniformly per position
    max_value: int = 999  # largest allowed intermediate/final value (the tokenizer's top number)
    eval_fraction: float = 0.1  # share of all problems reserved for eval_set (by a stable hash)
    partial_credit: float = 0.0  # reward share for correct scratchpad steps when the answer is wrong
    _max_tries: int = field(default=1000, repr=False)  # rejection-sampling rounds before giving up

    def __post_init__(self):
        object.__setattr__(self, "ops", tuple(self.ops))  # a list from JSON becomes a tuple
        if self.n_operands < 2:
            raise ValueError(f"ArithmeticTask.n_operands: need >= 2, got {self.n_operands}")
        if not 0 <= self.low <= self.high <= self.max_value:
            raise ValueError(
                f"ArithmeticTask: need 0 <= low <= high <= max_value, got low={self.low} "
                f"high={self.high} max_value={self.max_value}"
            )
        if not self.ops or any(op not in _OPS for op in self.ops):
            raise ValueError(f"ArithmeticTask.ops: must be a non-empty subset of {sorted(_OPS)}, got {self.ops}")
        if not 0.0 < self.eval_fraction < 1.0:
            raise ValueError(f"ArithmeticTask.eval_fraction: must be in (0, 1), got {self.eval_fraction}")
        if not 0.0 <= self.partial_credit < 1.0:
            raise ValueError(f"ArithmeticTask.partial_credit: must be in [0, 1), got {self.partial_credit}")

    @property
    def response_tokens(self) -> int:
        """Length in tokens of a perfect response (the scratchpad target), without end-of-sequence."""
        return 6 * self.n_operands - 4

    def is_eval(self, numbers: tuple[int, ...], ops: tuple[str, ...]) -> bool:
        """Whether the problem belongs to the held-out eval pool (stable across runs and machines)."""
        key = (" ".join(_interleave(numbers, ops))).encode()
        h = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")
        return h < self.eval_fraction * 2**64

    def sample(self, n: int, rng: torch.Generator | random.Random | int) -> list[Problem]:
        """`n` training problems (never from the eval pool), drawn uniformly with replacement."""
        return self._draw(n, _as_generator(rng), want_eval=False)

    def eval_set(self, n: int, seed: int = 0) -> list[Problem]:
        """`n` held-out problems, the same for the same (task, n, seed)."""
        return self._draw(n, torch.Generator().manual_seed(seed), want_eval=True)

    def _draw(self, n: int, gen: torch.Generator, want_eval: bool) -> list[Problem]:
        if n < 0:
            raise ValueError(f"n: must be >= 0, got {n}")
        out: list[Problem] = []
        k = self.n_operands
        for _ in range(self._max_tries):
            if len(out) == n:
                return out
            m = 2 * (n - len(out)) + 8
            nums = torch.randint(self.low, self.high + 1, (m, k), generator=gen).tolist()
            op_idx = torch.randint(0, len(self.ops), (m, k - 1), generator=gen).tolist()
            for row, idx in zip(nums, op_idx, strict=True):
                ops = tuple(self.ops[i] for i in idx)
                if self.is_eval(tuple(row), ops) != want_eval:
                    continue
                if not all(0 <= s[3] <= self.max_value for s in _steps(row, ops)):
                    continue
                out.append(Problem.from_numbers(tuple(row), ops))
                if len(out) == n:
                    break
        if len(out) < n:
            raise ValueError(
                f"ArithmeticTask: could not draw {n} valid problems (got {len(out)}); the config "
                f"{self} leaves too few problems with results in [0, {self.max_value}]"
            )
        return out

    def reward(self, problem: Problem, response: str) -> float:
        """1.0 if the number after the first ``answer`` word equals `problem.answer`, else partial
        credit (``partial_credit`` × share of exact scratchpad steps along the best-matching valid
        path, 0 by default).

        `response` is the decoded response text; words are whitespace-separated, special-token
        text such as ``<eos>`` is ignored, and anything after the final answer is ignored.
        """
        words = response.split()
        if ANSWER in words:
            i = words.index(ANSWER)
            if i + 1 < len(words) and words[i + 1] == str(problem.answer):
                return 1.0
            words = words[:i]
        if self.partial_credit == 0.0:
            return 0.0
        written = [got.split() for got in " ".join(words).split(STEP_SEP)]
        right = max(
            sum(got == [str(a), op, str(b), "=", str(c)] for got, (a, op, b, c) in zip(written, steps, strict=False))
            for steps in problem.paths(self.max_value)
        )
        return self.partial_credit * right / len(problem.steps)
