"""Jupyter Server extension: a ``sandbox`` in the CSP of the ``/nbconvert/`` pages.

Why: jupyter_server before 2.20.0 serves ``/nbconvert/html/<notebook>`` (and
the POST form of it) under the Jupyter origin with a Content-Security-Policy
of ``frame-ancestors 'self'`` only.  nbconvert's HTML export does not sanitize
outputs, so a notebook carrying HTML/JavaScript in an output runs that script
with the user's cookie and token: full API access, kernels, terminals
(CVE-2026-44727, GHSA-fcw5-x6j4-ccmp).  2.20.0 adds ``sandbox allow-scripts``,
which gives such a page an opaque origin, as ``/files/`` already has.  The
newest jupyter_server that installs on Python 3.8 (the real base) is 2.14.2, so
the image applies the same change here.

Loaded by /etc/jupyter/jupyter_server_config.py (``jpserver_extensions``); the
server logs one line when it is in place.  Installed as a top-level module on
the image's ``sys.path`` (/opt/tfmp/src).
"""
from __future__ import annotations

SANDBOX = "sandbox allow-scripts"


def with_sandbox(policy: str) -> str:
    """``policy`` with a ``sandbox`` directive added, unless it has one already."""
    directives = [d.strip() for d in policy.split(";") if d.strip()]
    if any(d.split()[0].lower() == "sandbox" for d in directives):
        return policy
    return "; ".join(directives + [SANDBOX])


def _sandboxed_property(cls):
    inherited = cls.content_security_policy  # the property object of the base handler

    def content_security_policy(self) -> str:
        return with_sandbox(inherited.fget(self))

    return property(content_security_policy, doc="CSP with sandbox (tfmp_nbconvert_csp)")


def nbconvert_handler_classes() -> list:
    from jupyter_server.nbconvert import handlers

    return [handlers.NbconvertFileHandler, handlers.NbconvertPostHandler]


def apply() -> list:
    """Patch the handler classes in place; returns their names.  Idempotent."""
    names = []
    for cls in nbconvert_handler_classes():
        if not getattr(cls, "_tfmp_sandboxed", False):
            cls.content_security_policy = _sandboxed_property(cls)
            cls._tfmp_sandboxed = True
        names.append(cls.__name__)
    return names


def _jupyter_server_extension_points():
    return [{"module": "tfmp_nbconvert_csp"}]


def _load_jupyter_server_extension(serverapp) -> None:
    names = apply()
    serverapp.log.info("tfmp_nbconvert_csp: %s answer with '%s' in their Content-Security-Policy",
                       ", ".join(names), SANDBOX)
