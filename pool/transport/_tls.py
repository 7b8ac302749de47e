"""One TLS context for every connection the pool makes."""

from __future__ import annotations

import functools
import os
import ssl


@functools.cache
def shared_ssl_context() -> ssl.SSLContext:
    """One TLS context for every connection.

    Passing ``verify=<bool>`` to each httpx call makes httpx load the CA bundle again
    for every request (30 % of a busy pool's CPU, and most of its memory, in
    scripts/bench). A context object is used as given. Honours ``SSL_CERT_FILE`` /
    ``SSL_CERT_DIR`` as httpx does.
    """
    cafile, capath = os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR")
    if cafile or capath:
        return ssl.create_default_context(cafile=cafile, capath=capath)
    import certifi

    return ssl.create_default_context(cafile=certifi.where())
