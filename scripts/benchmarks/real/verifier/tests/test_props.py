from hypothesis import given, settings, strategies as st

from bench_real import chunks, clamp, expand, merge_sorted, run_lengths

EXAMPLES = settings(max_examples=25, deadline=None, database=None)
small = st.lists(st.integers(-5, 5), max_size=30)


@EXAMPLES
@given(small)
def test_round_trip(values):
    assert expand(run_lengths(values)) == values


@EXAMPLES
@given(small)
def test_runs_differ(values):
    runs = run_lengths(values)
    assert all(a[0] != b[0] for a, b in zip(runs, runs[1:]))


@EXAMPLES
@given(small)
def test_counts_positive(values):
    assert all(count > 0 for _, count in run_lengths(values))


@EXAMPLES
@given(small, small)
def test_merge_sorted(left, right):
    assert merge_sorted(sorted(left), sorted(right)) == sorted(left + right)


@EXAMPLES
@given(small)
def test_merge_empty(values):
    assert merge_sorted(sorted(values), []) == sorted(values)


@EXAMPLES
@given(st.integers(), st.integers(), st.integers())
def test_clamp_bounds(value, low, high):
    low, high = min(low, high), max(low, high)
    assert low <= clamp(value, low, high) <= high


@EXAMPLES
@given(st.integers(-100, 100))
def test_clamp_identity(value):
    assert clamp(value, -100, 100) == value


@EXAMPLES
@given(small, st.integers(1, 7))
def test_chunks_join(values, size):
    assert [v for chunk in chunks(values, size) for v in chunk] == values


@EXAMPLES
@given(small, st.integers(1, 7))
def test_chunks_size(values, size):
    assert all(len(chunk) <= size for chunk in chunks(values, size))


@EXAMPLES
@given(small, st.integers(1, 7))
def test_chunks_count(values, size):
    assert len(chunks(values, size)) == -(-len(values) // size)
