"""Which environment variable names never reach a process casebox starts (S7 for ops, F2 on the trusted side).

``GIT_*`` variables retarget git (GIT_DIR, GIT_CONFIG_KEY_n/GIT_CONFIG_VALUE_n,
GIT_INDEX_FILE, GIT_OBJECT_DIRECTORY, ...; seed 002), ``ACTIONS_*`` reach the
CI runner's services with its token, and a name that looks like a credential
may carry one. The rule lives here, the lowest package, so the starter applies
it to every op and the trusted side to every subprocess. It imports nothing:
the launcher's start path stays on C modules.
"""

FORBIDDEN_PREFIXES = ("GIT_", "ACTIONS_")
CREDENTIAL_WORDS = ("TOKEN", "SECRET", "PASSW", "CREDENTIAL", "APIKEY", "API_KEY", "PRIVATE", "AUTH", "COOKIE", "SESSION")


def forbidden_variable(name: str) -> bool:
    """True for a name that must never reach a sandboxed op or a trusted-side subprocess, in any letter case."""
    upper = name.upper()
    return upper.startswith(FORBIDDEN_PREFIXES) or any(word in upper for word in CREDENTIAL_WORDS)
