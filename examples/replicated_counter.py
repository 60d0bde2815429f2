"""A replicated counter: three nodes of one walkit.replicate state machine in one script."""
import time

import walkit


class Counter(walkit.StateMachine):
    value = 0

    def apply(self, record, position):          # deterministic: every node computes the same
        self.value += int(record)
        return self.value

    def snapshot(self, out): out.write(str(self.value).encode())
    def restore(self, src): self.value = int(src.read())


with walkit.LocalCluster(bookies=3, data_dir="counter-data") as cluster:
    clients = [walkit.Client(cluster.metadata_url) for _ in range(3)]   # one client per node
    nodes = [walkit.replicate(Counter(), client=c, name="counter", node_id=f"node{i}")
             for i, c in enumerate(clients)]
    while not any(n.is_leader for n in nodes):  # the nodes elect a leader among themselves
        time.sleep(0.05)
    leader = next(n for n in nodes if n.is_leader)
    for _ in range(10):
        leader.submit(b"1")                     # appended, acknowledged, applied: the new count
    for node in nodes:
        node.read_barrier()                     # everything acknowledged so far is applied here
        print(node.node_id, "leader" if node.is_leader else "follower", node.machine.value)
    for node in nodes:                          # after the prints: closing the leader hands leadership on
        node.close()
