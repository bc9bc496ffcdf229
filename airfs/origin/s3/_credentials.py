"""Credentials and region: the ``AWS_*`` variables, the shared files, boto3 when installed."""

from __future__ import annotations

import configparser
import contextlib
import datetime as dt
import os
from collections.abc import Mapping
from typing import Any


class Credentials:
    """Credentials both obstore (as its ``credential_provider``) and :class:`RawS3` use."""

    def __init__(
        self,
        static: tuple[str, str, str | None] | None = None,
        refreshable: Any = None,
        source: str = "",
    ) -> None:
        self._static = static
        self._refreshable = refreshable  # botocore Credentials
        self.source = source

    def get(self) -> tuple[str, str, str | None]:
        if self._static is not None:
            return self._static
        frozen = self._refreshable.get_frozen_credentials()
        return frozen.access_key, frozen.secret_key, frozen.token

    def __call__(self) -> dict[str, Any]:
        ak, sk, token = self.get()
        expires = None
        if self._static is None:  # let obstore ask again; botocore refreshes before expiry
            expires = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5)
        return {"access_key_id": ak, "secret_access_key": sk, "token": token, "expires_at": expires}


def _profile(env: Mapping[str, str]) -> str:
    return env.get("AWS_PROFILE") or env.get("AWS_DEFAULT_PROFILE") or "default"


def _read_ini(path: str) -> configparser.RawConfigParser:
    cp = configparser.RawConfigParser()
    with contextlib.suppress(OSError, configparser.Error):
        cp.read(os.path.expanduser(path))
    return cp


def resolve_credentials(env: Mapping[str, str]) -> Credentials | None:
    ak, sk = env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY")
    if ak and sk:
        return Credentials((ak, sk, env.get("AWS_SESSION_TOKEN") or None), source="environment")
    profile = _profile(env)
    cp = _read_ini(env.get("AWS_SHARED_CREDENTIALS_FILE", "~/.aws/credentials"))
    if cp.has_section(profile):
        ak = cp.get(profile, "aws_access_key_id", fallback=None)
        sk = cp.get(profile, "aws_secret_access_key", fallback=None)
        if ak and sk:
            token = cp.get(profile, "aws_session_token", fallback=None)
            return Credentials((ak, sk, token), source=f"profile {profile}")
    try:
        import boto3  # optional: instance roles, SSO, assume-role profiles
    except ImportError:
        return None
    try:
        creds = boto3.Session(profile_name=env.get("AWS_PROFILE")).get_credentials()
    except Exception:
        return None
    return Credentials(refreshable=creds, source="boto3") if creds is not None else None


def resolve_region(env: Mapping[str, str]) -> str:
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if region:
        return region
    profile = _profile(env)
    cp = _read_ini(env.get("AWS_CONFIG_FILE", "~/.aws/config"))
    for section in (f"profile {profile}", profile):
        if cp.has_section(section) and cp.has_option(section, "region"):
            value = cp.get(section, "region")
            if value:
                return value
    return "us-east-1"


def truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")
