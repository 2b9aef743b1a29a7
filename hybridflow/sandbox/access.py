"""Who may run code through ``hybridflow sandbox``: its bearer token, and where it comes from.

``/run_code`` runs whatever it is sent, so it needs ``Authorization: Bearer TOKEN``. The token
is ``--token``, else ``$HYBRIDFLOW_SANDBOX_TOKEN`` (the environment keeps it out of the process
list: the trainer hands its child service the token this way), else a fresh one the service
prints at start. ``--no-token`` serves without one, on a loopback address only.
:class:`~hybridflow.sandbox.client.FusionSandbox` sends the token it is given, or
``$HYBRIDFLOW_SANDBOX_TOKEN``.
"""

from __future__ import annotations

from hybridflow.utils.http_guard import is_loopback, new_token

TOKEN_ENV = "HYBRIDFLOW_SANDBOX_TOKEN"


def resolve_token(host: str, token: str | None, no_token: bool) -> tuple[str | None, bool]:
    """The token ``/run_code`` needs (None: none) and whether it was generated here.

    Raises ``ValueError`` for ``no_token`` on an address other than loopback: anyone who can
    reach that address could run code on this machine."""
    if no_token:
        if not is_loopback(host):
            raise ValueError(
                f"--no-token is only allowed on a loopback --host (127.0.0.1, ::1, localhost), not "
                f"{host}: anyone who can reach that address could run code here"
            )
        return None, False
    if token:
        return token, False
    return new_token(), True
