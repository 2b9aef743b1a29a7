"""A dense test reward for the random tiny model: the share of lowercase ASCII letters in the response.

Built-in task scorers give a random model all-zero rewards (no gradient); this one varies
within each group, so GRPO-style advantages and policy updates are non-trivial in tests.
"""


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if not solution_str:
        return 0.0
    return sum("a" <= ch <= "z" for ch in solution_str) / len(solution_str)
