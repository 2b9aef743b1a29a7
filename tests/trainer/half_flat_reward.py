"""A test reward that leaves every other prompt without signal: prompts with an even dataset
index score 0 for every response (DAPO's filter must drop their groups); the others score the
share of lowercase ASCII letters, which varies within a group."""


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if int((extra_info or {}).get("index", 0)) % 2 == 0 or not solution_str:
        return 0.0
    return sum("a" <= ch <= "z" for ch in solution_str) / len(solution_str)
