"""How counts are written for people: `counted(1, "rank")` is "1 rank", `counted(8, "rank")` is
"8 ranks" ("micro-batch" takes "es")."""


def counted(n, noun):
    """n and the noun, plural unless n is 1."""
    if n == 1:
        return f"{n} {noun}"
    return f"{n} {noun}{'es' if noun.endswith(('ch', 'sh', 's', 'x')) else 's'}"
