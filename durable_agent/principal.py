"""Who asks, and who decides: a person as the application's own authentication knows them.

    Principal(tenant="acme", user="u-17", roles=("support-lead",), display_name="Ada")

The application gives it (`AgentClient.ask/start/chat(principal=...)`, a decision's
`approve(..., principal=...)`), from its own authentication; it is never taken from
what a user typed or a model wrote. A turn records it in its input and in the search
attributes `AgentTenant` and `AgentCustomer` (its user); tools read it as `ctx.principal`, and an
instructions function that takes a `principal` parameter gets it.

`customer` is the user of the default tenant: `customer="c-42"` and
`principal=Principal(user="c-42")` ask as the same person, and a turn's `customer_id`
is always its principal's `user`. Ids are matched whole, so a tenant's id has no
character a user id may need to be told apart from it (`tenant:user` never names two
people).
"""

from __future__ import annotations

import re
import unicodedata

from pydantic import BaseModel, ConfigDict, field_validator

DEFAULT_TENANT = "default"
"""The tenant of a turn whose caller names only a customer."""
MAX_TENANT_CHARS = 64
MAX_ROLES = 20
MAX_ROLE_CHARS = 64
MAX_DISPLAY_NAME_CHARS = 200
MAX_USER_CHARS = 500
"""As a customer id (`types.MAX_CUSTOMER_ID_CHARS`): emails, OIDC subjects."""

_NAME = re.compile(r"[a-z0-9][a-z0-9._-]*")
"""A tenant's or a role's id: lower-case letters, digits, `.`, `_`, `-`; so one id has
one spelling, and none holds `:` (the separator of `Principal.key`)."""
_UNSEEN = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


class Principal(BaseModel):
    """A person a turn acts for, or one who decides on its calls. Frozen and checked:
    `ValueError` (a pydantic `ValidationError`) in one line on a malformed id."""

    model_config = ConfigDict(frozen=True)

    user: str
    """Their id in the application (as `customer` was): 1-500 characters, no control
    or invisible character, no space at either end."""
    tenant: str = DEFAULT_TENANT
    """The organisation they belong to: 1-64 of `a-z 0-9 . _ -`, starting with a letter
    or digit."""
    roles: tuple[str, ...] = ()
    """What they may do (`support-lead`): at most 20, each spelled as a tenant is."""
    display_name: str = ""
    """How they are shown (never compared): one line, at most 200 characters."""

    @field_validator("user")
    @classmethod
    def _user(cls, v: str) -> str:
        if (
            not 0 < len(v) <= MAX_USER_CHARS
            or v != v.strip()
            or any(unicodedata.category(c) in _UNSEEN for c in v)
        ):
            raise ValueError(
                f"a user id must be 1-{MAX_USER_CHARS} characters of text, with no control "
                "or invisible characters and no space at either end"
            )
        return v

    @field_validator("tenant")
    @classmethod
    def _tenant(cls, v: str) -> str:
        if len(v) > MAX_TENANT_CHARS or not _NAME.fullmatch(v):
            raise ValueError(
                f"a tenant id must be 1-{MAX_TENANT_CHARS} of a-z 0-9 . _ -, starting with a "
                f"letter or digit (not {v[:80]!r})"
            )
        return v

    @field_validator("roles")
    @classmethod
    def _roles(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if len(v) > MAX_ROLES:
            raise ValueError(f"at most {MAX_ROLES} roles, not {len(v)}")
        for role in v:
            if len(role) > MAX_ROLE_CHARS or not _NAME.fullmatch(role):
                raise ValueError(
                    f"a role must be 1-{MAX_ROLE_CHARS} of a-z 0-9 . _ -, starting with a "
                    f"letter or digit (not {role[:80]!r})"
                )
        return tuple(sorted(set(v)))

    @field_validator("display_name")
    @classmethod
    def _display_name(cls, v: str) -> str:
        v = " ".join(v.split())
        if len(v) > MAX_DISPLAY_NAME_CHARS or any(unicodedata.category(c) in _UNSEEN for c in v):
            raise ValueError(
                f"a display name is one line of at most {MAX_DISPLAY_NAME_CHARS} characters"
            )
        return v

    @property
    def key(self) -> str:
        """`tenant:user`: one person, whatever their ids (a tenant id has no `:`)."""
        return f"{self.tenant}:{self.user}"

    def same_person(self, other: Principal) -> bool:
        """Whether both name one person: tenant and user, compared whole."""
        return (self.tenant, self.user) == (other.tenant, other.user)

    def shown(self) -> str:
        """For a story or a list: `Ada (acme:u-17)`, or the key alone."""
        return f"{self.display_name} ({self.key})" if self.display_name else self.key


def of_customer(customer_id: str) -> Principal:
    """The principal of a turn whose caller named only a customer: its user, in the
    default tenant, with no role."""
    return Principal(user=customer_id)


__all__ = ["DEFAULT_TENANT", "Principal", "of_customer"]
