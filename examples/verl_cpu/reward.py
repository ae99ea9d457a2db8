"""The CPU example's reward (verl's `reward.custom_reward_function.path`): the share of response
words that are the digit to repeat."""


def compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float:
    words = solution_str.split()
    return sum(w == ground_truth for w in words) / len(words) if words else 0.0
