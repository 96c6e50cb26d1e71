"""Roman numerals."""

NUMERALS = [
    (1000, "M"),
    (500, "D"),
    (100, "C"),
    (50, "L"),
    (10, "X"),
    (5, "V"),
    (1, "I"),
]


def to_roman(n):
    if not 0 < n < 4000:
        raise ValueError("out of range")
    out = []
    for value, letters in NUMERALS:
        count, n = divmod(n, value)
        out.append(letters * count)
    return "".join(out)
