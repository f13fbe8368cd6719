"""Evidence: receipts, junit counts, published outputs and the evaluator.

The evaluator's import limit: this package imports only itself, executor.plan,
executor's VERSION, journal/ and launcher.vocabulary, so it runs unprivileged
anywhere (tests/test_layout.py checks it)."""
