"""walkit.adapters.topics.acls keeps the cluster's ACL bindings (CreateAcls, DescribeAcls, DeleteAcls).

The bindings are stored, not enforced: no request is checked against them, whoever sends it
(with SASL, every authenticated user may do everything; without it, every client). They are
kept so that tools which manage ACLs (AdminClient's create_acls, describe_acls, delete_acls,
kafka-acls) work against walkit and find what they stored, and so a cluster moved to an
enforcing broker can take them along.

A binding is Kafka's: a resource pattern (resource type, name, LITERAL or PREFIXED) and an
entry (principal "User:NAME", host, operation, ALLOW or DENY), with Kafka's enum values.
`AclFilter.matches` is Kafka's AclBindingFilter: ANY matches every value, a null name,
principal or host every one, and the MATCH pattern type matches the literal name, the
wildcard "*" and every prefix of the name. The bindings are one JSON list in the metadata
store (``topics/acls``), changed by compare-and-set, so brokers changing them at once lose
nothing; creating a binding that exists is a no-op, as in Kafka.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from walkit.adapters.topics import errors
from walkit.adapters.topics.catalog import PREFIX
from walkit.adapters.topics.errors import KafkaError
from walkit.errors import BadVersion, NodeExists, NoSuchKey

ACLS = f"{PREFIX}/acls"
UNKNOWN, ANY = 0, 1
MATCH, LITERAL, PREFIXED = 2, 3, 4
DENY, ALLOW = 2, 3
#: Resource types a binding may name: topic, group, cluster, transactional id, delegation token, user.
RESOURCE_TYPES = {2, 3, 4, 5, 6, 7}
#: Operations a binding may name: ALL (2) to DESCRIBE_TOKENS (14).
OPERATIONS = set(range(2, 15))
WILDCARD = "*"
#: Compare-and-set attempts of a change to the bindings before it gives up.
UPDATE_ATTEMPTS = 20


@dataclass(frozen=True)
class AclBinding:
    """AclBinding is one ACL: a resource pattern and an entry (see the module doc)."""

    resource_type: int
    resource_name: str
    pattern_type: int
    principal: str
    host: str
    operation: int
    permission: int

    def check(self) -> "AclBinding":
        """check returns the binding, or raises KafkaError(INVALID_REQUEST) naming what Kafka would refuse."""
        if self.resource_type not in RESOURCE_TYPES:
            raise KafkaError(errors.INVALID_REQUEST, f"resource type {self.resource_type} cannot be bound")
        if self.pattern_type not in (LITERAL, PREFIXED):
            raise KafkaError(errors.INVALID_REQUEST, f"pattern type {self.pattern_type}: use LITERAL or PREFIXED")
        if self.operation not in OPERATIONS:
            raise KafkaError(errors.INVALID_REQUEST, f"operation {self.operation} cannot be bound")
        if self.permission not in (ALLOW, DENY):
            raise KafkaError(errors.INVALID_REQUEST, f"permission type {self.permission}: use ALLOW or DENY")
        if not self.resource_name:
            raise KafkaError(errors.INVALID_REQUEST, "an empty resource name")
        kind, _, name = (self.principal or "").partition(":")
        if not kind or not name:
            raise KafkaError(errors.INVALID_REQUEST, f"principal {self.principal!r}: use TYPE:NAME, as User:alice")
        if not self.host:
            raise KafkaError(errors.INVALID_REQUEST, "an empty host (use * for every host)")
        return self

    def to_json(self) -> list:
        """to_json is the binding as the JSON list stored."""
        return [self.resource_type, self.resource_name, self.pattern_type, self.principal, self.host, self.operation,
                self.permission]


@dataclass(frozen=True)
class AclFilter:
    """AclFilter selects bindings, as Kafka's AclBindingFilter (None: any name, principal or host)."""

    resource_type: int
    resource_name: str | None
    pattern_type: int
    principal: str | None
    host: str | None
    operation: int
    permission: int

    def check(self) -> "AclFilter":
        """check returns the filter, or raises KafkaError(INVALID_REQUEST) for UNKNOWN values."""
        if UNKNOWN in (self.resource_type, self.pattern_type, self.operation, self.permission):
            raise KafkaError(errors.INVALID_REQUEST, "a filter with an UNKNOWN resource, pattern, operation or "
                                                     "permission type")
        return self

    def matches(self, binding: AclBinding) -> bool:
        """matches tells whether `binding` is one the filter selects."""
        return self._matches_pattern(binding) and (
            (self.principal is None or self.principal == binding.principal)
            and (self.host is None or self.host == binding.host)
            and self.operation in (ANY, binding.operation) and self.permission in (ANY, binding.permission))

    def _matches_pattern(self, binding: AclBinding) -> bool:
        if self.resource_type not in (ANY, binding.resource_type):
            return False
        if self.pattern_type not in (ANY, MATCH, binding.pattern_type):
            return False
        if self.resource_name is None:
            return True
        if self.pattern_type in (ANY, binding.pattern_type):
            return self.resource_name == binding.resource_name
        if binding.pattern_type == LITERAL:
            return binding.resource_name in (self.resource_name, WILDCARD)
        return self.resource_name.startswith(binding.resource_name)


class AclStore:
    """AclStore reads and changes the bindings in a MetadataStore (blocking calls)."""

    def __init__(self, store) -> None:
        self.store = store

    def bindings(self) -> list[AclBinding]:
        """bindings are every stored binding."""
        return self._read()[0]

    def describe(self, wanted: AclFilter) -> list[AclBinding]:
        """describe returns the bindings `wanted` selects."""
        return [b for b in self.bindings() if wanted.matches(b)]

    def create(self, bindings: list[AclBinding]) -> None:
        """create stores the bindings that are not stored yet."""
        self._update(lambda stored: stored + [b for b in dict.fromkeys(bindings) if b not in stored])

    def delete(self, filters: list[AclFilter]) -> list[list[AclBinding]]:
        """delete removes every binding a filter selects; it returns, per filter, the bindings it selected."""
        matched: list[list[AclBinding]] = []

        def change(stored: list[AclBinding]) -> list[AclBinding]:
            matched[:] = [[b for b in stored if f.matches(b)] for f in filters]
            return [b for b in stored if not any(f.matches(b) for f in filters)]
        self._update(change)
        return matched

    def _read(self) -> tuple[list[AclBinding], int | None]:
        try:
            value, version = self.store.get(ACLS)
        except NoSuchKey:
            return [], None
        return [AclBinding(*row) for row in json.loads(value)], version

    def _update(self, change) -> None:
        for _ in range(UPDATE_ATTEMPTS):
            stored, version = self._read()
            data = json.dumps([b.to_json() for b in change(stored)]).encode()
            try:
                if version is None:
                    self.store.create(ACLS, data)
                else:
                    self.store.put(ACLS, data, version)
                return
            except (BadVersion, NodeExists, NoSuchKey):
                continue
        raise KafkaError(errors.UNKNOWN_SERVER_ERROR, f"the ACLs changed {UPDATE_ATTEMPTS} times meanwhile")
