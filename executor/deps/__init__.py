"""Dependencies: the preparer and its resolver and fetch sandboxes, the resolver protocol, the runner-shadowing rule (E7; docs/pipeline.md)."""
