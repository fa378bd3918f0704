"""Names a secret may not have: each is read by bash, the dynamic loader or a language runtime on
its own, and its value becomes code (or chooses which code runs) before any of the version's.

A secret's value is data, written by whoever writes its parameter (a CI job's `--secret`, the api);
under one of these names it would be code run as root on every replica. The api refuses them in a
spec's `secrets` (a 400 naming the secret); a replica's boot refuses them too
(reconciler/replica_boot.py holds the same list: it runs on the instance with the standard library
alone, so it cannot import this; tests/replicas/test_boot_secrets.py keeps the two equal). Why each
is in, and why some are out: docs/architecture/replicas.md, "Secret names a version may not use".
"""

from __future__ import annotations

REFUSED_SECRET_NAMES = frozenset(
    {
        # bash and sh: expanded and sourced by every non-interactive shell (ENV in POSIX mode), the
        # options and prompts that run expansions (SHELLOPTS=xtrace with PS4), word splitting,
        # the directories commands and `cd` search.
        "ENV",
        "SHELLOPTS",
        "PS0",
        "PS1",
        "PS2",
        "PS3",
        "PS4",
        "PROMPT_COMMAND",
        "IFS",
        "CDPATH",
        "GLOBIGNORE",
        "EXECIGNORE",
        "POSIXLY_CORRECT",
        # Which programs run.
        "PATH",
        "SHELL",
        # Node's and the JVM's start-up options and module paths (NODE_OPTIONS=--import runs code).
        "NODE_OPTIONS",
        "NODE_PATH",
        "CLASSPATH",
        "JAVA_TOOL_OPTIONS",
        "_JAVA_OPTIONS",
        "JDK_JAVA_OPTIONS",
        # Modules glibc loads (iconv, locales, message catalogues).
        "GCONV_PATH",
        "LOCPATH",
        "NLSPATH",
    }
)
# BASH_ENV, BASH_FUNC_* (exported function bodies) and bash's other variables; the dynamic loader's
# LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT...; Python's (PYTHONPATH, PYTHONSTARTUP, PYTHONHOME,
# PYTHONBREAKPOINT...), Perl's (PERL5OPT, PERL5LIB, PERLLIB, PERL5DB), Ruby's (RUBYOPT, RUBYLIB),
# Lua's (LUA_INIT runs code) and OpenSSL's (OPENSSL_CONF, OPENSSL_MODULES load modules).
REFUSED_SECRET_PREFIXES = ("BASH_", "LD_", "PYTHON", "PERL", "RUBY", "LUA_", "OPENSSL_")


def refused_secret_name(name: str) -> bool:
    """Whether a secret may not be called `name` (case matters, as it does to the programs)."""
    return name in REFUSED_SECRET_NAMES or name.startswith(REFUSED_SECRET_PREFIXES)
