"""How counts and sizes are written for people, one way everywhere: `counted(1, "rank")` is
"1 rank", `counted(8, "rank")` is "8 ranks" ("micro-batch" takes "es"); `format_bytes(n)` is
"84 B", "807.9 MB", "1.2 GB" (decimal units, one decimal)."""


def counted(n, noun):
    """n and the noun, plural unless n is 1."""
    if n == 1:
        return f"{n} {noun}"
    return f"{n} {noun}{'es' if noun.endswith(('ch', 'sh', 's', 'x')) else 's'}"


def format_bytes(n):
    """n bytes in the largest decimal unit it reaches."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"
