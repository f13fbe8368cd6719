"""The unprivileged side of casebox: the CLI, transport, plans, receipts and the evaluator."""
