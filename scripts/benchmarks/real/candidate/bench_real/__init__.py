"""Small pure functions for property tests (the session_real benchmark's candidate)."""


def run_lengths(values):
    """Run-length encoding: [(value, count), ...]."""
    out = []
    for value in values:
        if out and out[-1][0] == value:
            out[-1] = (value, out[-1][1] + 1)
        else:
            out.append((value, 1))
    return out


def expand(runs):
    return [value for value, count in runs for _ in range(count)]


def merge_sorted(left, right):
    out, i, j = [], 0, 0
    while i < len(left) and j < len(right):
        if left[i] <= right[j]:
            out.append(left[i])
            i += 1
        else:
            out.append(right[j])
            j += 1
    return out + left[i:] + right[j:]


def clamp(value, low, high):
    return max(low, min(high, value))


def chunks(values, size):
    return [values[i:i + size] for i in range(0, len(values), size)]
