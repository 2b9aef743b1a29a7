"""A dense test reward (the tiny random model never solves the task): distinct characters / 10."""


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return len(set(solution_str)) / 10.0
