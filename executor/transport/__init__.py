"""The candidate's transport: the bundle format, its pack, preflight, reader and extractor, the identity digest (T1–T5; docs/transport.md)."""
