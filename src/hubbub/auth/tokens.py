"""Token verification (protocols README §6): static tokens and JWTs (HS256, RS256).

:class:`Authenticator` is the one function every dialect calls: it extracts nothing itself, it is handed
the token the dialect found (a header, a query parameter, a ``hello`` field, a path segment) and returns an
:class:`~hubbub.auth.grants.Identity` or raises :class:`~hubbub.errors.AuthError`:

=====  ===============  ======================================================================
code   name             when
=====  ===============  ======================================================================
4100   auth_required    no token (``None`` or empty)
4101   bad_token        unknown static token; JWT malformed, of another algorithm, signed by no
                        configured key, not yet valid (``nbf``), or with invalid claims
4103   token_expired    a JWT whose ``exp`` (plus the clock-skew allowance) has passed
=====  ===============  ======================================================================

The ``detail`` of the error is a short, safe reason for the audit log; it never contains the token.

Keys: :func:`load_keys` reads ``auth.jwt_keys`` entries and the JWKS file. It is the one place that reads
files, and runs at start-up and on reload (SIGHUP), called from the composition root; a reload builds a new
:class:`Authenticator` and the caller swaps it in, so connections already authenticated keep their identity.

Concurrency contract: an :class:`Authenticator` is synchronous; its verified-token cache is a plain dict,
used from the event loop thread.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.types import Options

from hubbub.errors import AuthError, BadChannel

from .grants import EVERYTHING, Grant, Identity

__all__ = [
    "ALGORITHMS",
    "Authenticator",
    "KeySet",
    "StaticTokens",
    "load_keys",
    "parse_static_tokens",
]

ALGORITHMS: Final = ("HS256", "RS256")
#: Shortest HS256 secret accepted (RFC 7518 §3.2: a key of at least the hash's size).
MIN_SECRET_BYTES: Final = 32
#: Verified JWTs remembered (token -> identity), so an HTTP client sending the same bearer token on every
#: request costs one signature check, not one per request. Cleared when full.
VERIFIED_CACHE: Final = 4096


@dataclass(frozen=True, slots=True)
class KeySet:
    """The JWT verification keys: HS256 secrets and RS256 public keys, each with an optional ``kid``."""

    hs256: tuple[tuple[str | None, bytes], ...] = ()
    rs256: tuple[tuple[str | None, Any], ...] = ()

    def __repr__(self) -> str:
        return f"KeySet(hs256={len(self.hs256)} keys, rs256={len(self.rs256)} keys)"

    def __bool__(self) -> bool:
        return bool(self.hs256 or self.rs256)

    def candidates(self, alg: str, kid: str | None) -> list[Any]:
        """The keys to try for a token of algorithm ``alg`` naming ``kid``: the keys with that kid when any
        has it, else every key of the algorithm."""
        keys = self.hs256 if alg == "HS256" else self.rs256 if alg == "RS256" else ()
        if kid is not None:
            named = [k for i, k in keys if i == kid]
            if named:
                return named
        return [k for _i, k in keys]


def _rsa_public(pem: bytes, where: str) -> rsa.RSAPublicKey:
    """An RSA public key from PEM (a private key gives its public half: only that is needed to verify)."""
    key: Any
    try:
        key = serialization.load_pem_public_key(pem)
    except ValueError:
        try:
            key = serialization.load_pem_private_key(pem, password=None).public_key()
        except (ValueError, TypeError):
            raise ValueError(f"{where}: not a PEM public key") from None
    except TypeError:
        raise ValueError(f"{where}: not a PEM public key") from None
    if not isinstance(key, rsa.RSAPublicKey):
        raise ValueError(f"{where}: not an RSA key")
    return key


def load_keys(entries: Sequence[str], jwks_file: str = "") -> KeySet:
    """Build the key set from ``auth.jwt_keys`` and ``auth.jwks_file``.

    Each entry is an RSA public key in PEM (``-----BEGIN …``: RS256), ``file:<path>`` (the file's content,
    PEM for RS256, otherwise an HS256 secret with trailing newlines removed), or else an HS256 secret.
    The JWKS file is a JSON Web Key Set with ``RSA`` (RS256) and ``oct`` (HS256) keys, with their ``kid``.
    Raises :class:`ValueError` naming the entry (never its content) when something cannot be used.
    """
    hs: list[tuple[str | None, bytes]] = []
    rs: list[tuple[str | None, Any]] = []
    for i, raw in enumerate(entries):
        where = f"auth.jwt_keys[{i}]"
        data: bytes
        if raw.startswith("file:"):
            path = raw[5:]
            try:
                with open(path, "rb") as fh:
                    data = fh.read()
            except OSError as exc:
                raise ValueError(f"{where}: cannot read {path}: {exc.strerror}") from None
            where = f"{where} ({path})"
        else:
            data = raw.encode("utf-8")
        if data.lstrip().startswith(b"-----BEGIN"):
            rs.append((None, _rsa_public(data, where)))
        else:
            secret = data.rstrip(b"\r\n")
            if len(secret) < MIN_SECRET_BYTES:
                raise ValueError(f"{where}: an HS256 secret needs at least {MIN_SECRET_BYTES} bytes")
            hs.append((None, secret))
    if jwks_file:
        try:
            with open(jwks_file, "rb") as fh:
                doc = json.loads(fh.read())
            keys = doc["keys"] if isinstance(doc, dict) else None
            if not isinstance(keys, list):
                raise ValueError("no keys list")
        except (OSError, ValueError, KeyError) as exc:
            raise ValueError(f"auth.jwks_file {jwks_file}: not a JWK set ({exc})") from None
        for j, k in enumerate(keys):
            where = f"auth.jwks_file {jwks_file} key {j}"
            if not isinstance(k, dict):
                raise ValueError(f"{where}: not an object")
            kid = k.get("kid") if isinstance(k.get("kid"), str) else None
            try:
                jwk = jwt.PyJWK.from_dict(k)
            except (jwt.PyJWKError, jwt.InvalidKeyError, ValueError, TypeError) as exc:
                raise ValueError(f"{where}: {type(exc).__name__}") from None
            if k.get("kty") == "RSA":
                key = jwk.key
                rs.append((kid, key.public_key() if hasattr(key, "private_bytes") else key))
            elif k.get("kty") == "oct":
                if len(jwk.key) < MIN_SECRET_BYTES:
                    raise ValueError(f"{where}: an HS256 secret needs at least {MIN_SECRET_BYTES} bytes")
                hs.append((kid, bytes(jwk.key)))
            else:
                raise ValueError(f"{where}: key type {k.get('kty')!r} is not RSA or oct")
    return KeySet(tuple(hs), tuple(rs))


@dataclass(frozen=True, slots=True)
class StaticTokens:
    """``auth.tokens``: identities by the SHA-256 of their token, so the table never holds a token and a
    lookup's timing tells nothing about a token's text."""

    by_digest: Mapping[bytes, Identity]

    def __repr__(self) -> str:
        return f"StaticTokens({len(self.by_digest)} tokens)"

    def get(self, token: str) -> Identity | None:
        return self.by_digest.get(hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest())


def _grant(value: Any, where: str) -> Grant:
    if value is None:
        return EVERYTHING
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise ValueError(f"{where}: expected a list of patterns")
    try:
        return Grant.parse(value)
    except BadChannel as exc:
        raise ValueError(f"{where}: {exc.detail}") from None


def parse_static_tokens(table: Mapping[str, Any]) -> StaticTokens:
    """Parse ``auth.tokens`` (token → ``{"user", "publish", "subscribe", "admin"}``; defaults ``""``,
    ``["/**"]``, ``["/**"]``, false). Raises :class:`ValueError` naming the token's user or position, never
    the token."""
    out: dict[bytes, Identity] = {}
    for n, (token, spec) in enumerate(table.items()):
        where = f"auth.tokens entry {n}"
        if not token:
            raise ValueError(f"{where}: empty token")
        if not isinstance(spec, Mapping):
            raise ValueError(f"{where}: expected an object with user, publish, subscribe, admin")
        unknown = set(spec) - {"user", "publish", "subscribe", "admin"}
        if unknown:
            raise ValueError(f"{where}: unknown fields {sorted(unknown)}")
        user = spec.get("user", "")
        admin = spec.get("admin", False)
        if not isinstance(user, str) or not isinstance(admin, bool):
            raise ValueError(f"{where}: user must be a string and admin a boolean")
        ident = Identity(
            user,
            _grant(spec.get("publish"), f"{where} publish"),
            _grant(spec.get("subscribe"), f"{where} subscribe"),
            admin,
            None,
            "static",
        )
        out[hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()] = ident
    return StaticTokens(out)


class Authenticator:
    """Verifies tokens against the static table and the JWT keys. See the module docstring.

    ``leeway`` is the clock-skew allowance in seconds for ``exp`` and ``nbf``; ``audience`` and ``issuer``,
    when set, must match the JWT's ``aud`` and ``iss``. ``clock`` returns Unix seconds (tests pass their own).
    """

    __slots__ = ("_cache", "audience", "clock", "issuer", "keys", "leeway", "static")

    def __init__(
        self,
        static: StaticTokens | None = None,
        keys: KeySet | None = None,
        *,
        leeway: float = 30.0,
        audience: str = "",
        issuer: str = "",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.static = static or StaticTokens({})
        self.keys = keys or KeySet()
        self.leeway = leeway
        self.audience = audience
        self.issuer = issuer
        self.clock = clock
        self._cache: dict[str, Identity] = {}

    def __repr__(self) -> str:
        return f"Authenticator({self.static!r}, {self.keys!r}, leeway={self.leeway})"

    def authenticate(self, token: str | None) -> Identity:
        """The identity ``token`` gives, or :class:`AuthError` (4100, 4101, 4103; module docstring)."""
        if not token:
            raise AuthError("no token", code=4100)
        ident = self.static.get(token)
        if ident is not None:
            return ident
        if token.count(".") != 2 or not token.isascii():
            # A JWT is three base64url parts: anything else (non-ASCII text included) is no token of ours.
            raise AuthError("unknown token", code=4101)
        hit = self._cache.get(token)
        if hit is not None:
            if hit.expires is not None and self.clock() >= hit.expires:
                del self._cache[token]
                raise AuthError("token expired", code=4103)
            return hit
        ident = self._verify_jwt(token)
        if len(self._cache) >= VERIFIED_CACHE:
            self._cache.clear()
        self._cache[token] = ident
        return ident

    def _verify_jwt(self, token: str) -> Identity:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError:
            raise AuthError("malformed token", code=4101) from None
        alg = header.get("alg")
        if alg not in ALGORITHMS:
            raise AuthError("token algorithm not accepted", code=4101)
        kid = header.get("kid") if isinstance(header.get("kid"), str) else None
        candidates = self.keys.candidates(alg, kid)
        if not candidates:
            raise AuthError("no key for the token's algorithm", code=4101)
        options: Options = {"verify_aud": bool(self.audience), "verify_iss": bool(self.issuer)}
        claims: dict[str, Any] | None = None
        now = self.clock()
        for key in candidates:
            try:
                claims = jwt.decode(
                    token,
                    key,
                    algorithms=[alg],
                    leeway=self.leeway,
                    audience=self.audience or None,
                    issuer=self.issuer or None,
                    options=options,
                    # PyJWT reads the clock itself; exp/nbf are checked against ours below as well.
                )
                break
            except jwt.InvalidSignatureError:
                continue
            except jwt.ExpiredSignatureError:
                raise AuthError("token expired", code=4103) from None
            except jwt.ImmatureSignatureError:
                raise AuthError("token not yet valid", code=4101) from None
            except jwt.InvalidTokenError as exc:
                raise AuthError(f"invalid token ({type(exc).__name__})", code=4101) from None
        if claims is None:
            raise AuthError("signature matches no key", code=4101)
        return self._identity(claims, now)

    def _identity(self, claims: Mapping[str, Any], now: float) -> Identity:
        exp = claims.get("exp")
        nbf = claims.get("nbf")
        # The injected clock decides too (PyJWT used the system clock): tests and skewed hosts agree.
        if isinstance(exp, int | float) and not isinstance(exp, bool) and now >= exp + self.leeway:
            raise AuthError("token expired", code=4103)
        if isinstance(nbf, int | float) and not isinstance(nbf, bool) and now < nbf - self.leeway:
            raise AuthError("token not yet valid", code=4101)
        sub = claims.get("sub", "")
        admin = claims.get("admin", False)
        if not isinstance(sub, str) or not isinstance(admin, bool):
            raise AuthError("invalid sub or admin claim", code=4101)
        try:
            publish = _grant(claims.get("publish"), "publish claim")
            subscribe = _grant(claims.get("subscribe"), "subscribe claim")
        except ValueError:
            raise AuthError("invalid publish or subscribe claim", code=4101) from None
        expires = float(exp) + self.leeway if isinstance(exp, int | float) else None
        return Identity(sub, publish, subscribe, admin, expires, "jwt")
