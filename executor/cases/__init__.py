"""Cases: the case service that starts every candidate sandbox and writes receipts, the runtime, the capability owners (C9, E6)."""
