"""The image's Jupyter authentication: the token entrypoint.sh wrote, whatever a config says.

docker/start/serve/10-jupyter.sh names this class on the server's command line
(``--ServerApp.identity_provider_class``), and the command line outranks every config file.
/etc/jupyter/jupyter_server_config.py sets the token too, but a config of the user's loads
after it (``~/.jupyter``, ``JUPYTER_CONFIG_DIR``, ``--config``), and one that set
``c.IdentityProvider.token = ""`` turned authentication off ("All authentication is
disabled") while the start-up still printed a URL with a token.  Here the token is read from
the file again and replaces whatever a config set; without one the server does not start.

Not used under JupyterHub, where the hub's OAuth is the authentication.
"""
import os

from jupyter_server.auth.identity import PasswordIdentityProvider

TOKEN_PATH_VAR = "TFMP_JUPYTER_TOKEN_PATH"


def image_token() -> str:
    """The token in the file the entrypoint wrote; SystemExit when there is none."""
    path = os.environ.get(TOKEN_PATH_VAR, "")
    token = ""
    if path:
        try:
            with open(path, encoding="utf-8") as fh:
                token = fh.read().strip()
        except OSError as exc:
            raise SystemExit(f"tfmp_token_auth: cannot read the Jupyter token ({exc})") from None
    if not token:
        raise SystemExit("tfmp_token_auth: no Jupyter token; start the server through "
                         "entrypoint.sh (a server without one would let anyone in)")
    return token


class TokenFileIdentityProvider(PasswordIdentityProvider):
    """Jupyter's token and password login, with the token always the image's."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._enforce()

    def _enforce(self) -> None:
        token = image_token()
        if self.token != token:
            if self.token:
                self.log.warning("a Jupyter config set another token: the image's is used "
                                 "(JUPYTER_TOKEN, JUPYTER_TOKEN_FILE or the start's own)")
            else:
                self.log.warning("a Jupyter config set an empty token, which would turn "
                                 "authentication off: the image's token is used")
            self.token = token
        self.token_generated = False

    def validate_security(self, app, ssl_options=None):
        # Again after ServerApp's own configuration (its deprecated ServerApp.token).
        self._enforce()
        super().validate_security(app, ssl_options)
