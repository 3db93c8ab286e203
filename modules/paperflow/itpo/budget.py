"""The tutoring episode's token budget (spec section 4): the sizes the environment builds episodes to and the config
check holds the model's positions to, without torch (the check runs while Snakemake builds the DAG)."""

MAX_TURNS = 3
MAX_FILLERS = 4
TURN_TOKENS = MAX_FILLERS + 3  # fillers, ANS, digit, EOT
PROMPT_LENGTH = 8  # BOS USER GOAL a= <a> F F AST
MAX_LENGTH = PROMPT_LENGTH + MAX_TURNS * TURN_TOKENS + (MAX_TURNS - 1) * 4
