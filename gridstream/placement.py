"""Where an operator's snapshots and rows live among the state servers, and
how many copies make a write count.

Every member (workers writing, clients and replicas reading, replicas
catching up) derives the same answer from the routing table, so nobody has to
ask where things are. An operator's replicas are the first R live state
servers clockwise from the operator's id on a ring of the live, non-retiring
state servers. When one dies, the next one on the ring takes its place for
new writes; the returning replica catches up and the stand-in hands its copy
back (see ``services/stateserver/sync.py``).

Write quorum W (default: a majority of R) and the read rule fit together: an
acknowledged write is on at least W servers, so a reader that heard from all
but at most W-1 of the state servers that could hold it has seen it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gridstream.ring import HashRing, ring_of
from gridstream.v1 import scheduler_pb2

_DEAD = scheduler_pb2.MEMBER_STATE_DEAD
_LEAVING = scheduler_pb2.MEMBER_STATE_LEAVING


@dataclass(frozen=True)
class ReplicaSet:
    """The state servers of one routing table, seen as a replicated group."""

    writable: dict[str, str]
    """node_id -> address of the live state servers that take new writes."""
    readable: dict[str, str]
    """node_id -> address of every live state server, retiring ones included."""
    members: int
    """State servers in the table (alive, suspect, dead or retiring): each may hold copies."""
    placeable: int
    """State servers that are not retiring: the most copies a write can have."""
    replicas: int
    """R as configured."""
    configured_quorum: int
    """W as configured; 0 means a majority."""
    virtual_nodes: int = 100
    _ring: HashRing = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_ring", ring_of(tuple(sorted(self.writable)), self.virtual_nodes))

    @classmethod
    def from_table(cls, table: scheduler_pb2.RoutingTable, virtual_nodes: int = 100,
                   default_replicas: int = 1) -> ReplicaSet:
        """The group as the table describes it (R and W come with the table)."""
        servers = [m for m in table.members
                   if m.role == scheduler_pb2.MEMBER_ROLE_STATE_SERVER]
        return cls(
            writable={m.node_id: m.address for m in servers
                      if m.state not in (_DEAD, _LEAVING)},
            readable={m.node_id: m.address for m in servers if m.state != _DEAD},
            members=len(servers),
            placeable=sum(1 for m in servers if m.state != _LEAVING),
            replicas=table.state_replicas or default_replicas,
            configured_quorum=table.state_write_quorum,
            virtual_nodes=virtual_nodes,
        )

    @property
    def copies(self) -> int:
        """R as it can be met: never more copies than there are state servers."""
        return max(1, min(self.replicas, self.placeable))

    @property
    def quorum(self) -> int:
        """W: acknowledgements a write needs (at most the copies it can have)."""
        wanted = self.configured_quorum or self.copies // 2 + 1
        return max(1, min(wanted, self.copies))

    def placement(self, operator_id: str) -> list[str]:
        """Node ids of the operator's replicas: the first R writable servers
        clockwise from it on the ring (fewer when fewer are alive)."""
        if not self.writable:
            return []
        return self._ring.walk(operator_id)[: self.copies]

    def enough_heard(self, answered: int) -> bool:
        """Whether answers from ``answered`` state servers are sure to include
        every acknowledged write: fewer than W of those that may hold one are
        silent (dead ones count as silent)."""
        return self.members - answered < self.quorum


Holdings = dict[str, tuple[int, int]]
"""operator id -> (highest result version, newest state window or -1) on one server."""


def replicas_ahead(read: set[str], holdings: Mapping[str, Holdings | None]) -> list[str]:
    """The servers not in ``read`` that hold a newer result version or state
    window of some operator than every server in ``read`` (an operator they
    alone hold counts). When what a server read holds is unknown, every
    server not read that answered, as reading them all would."""
    if any(holdings.get(node) is None for node in read):
        return sorted(n for n, held in holdings.items() if n not in read and held is not None)
    newest: Holdings = {}
    for node in read:
        for op, (version, window) in (holdings[node] or {}).items():
            seen = newest.get(op, (-1, -1))
            newest[op] = (max(seen[0], version), max(seen[1], window))
    return sorted(
        node for node, held in holdings.items()
        if node not in read and held is not None and any(
            version > newest.get(op, (-1, -1))[0] or window > newest.get(op, (-1, -1))[1]
            for op, (version, window) in held.items()))
